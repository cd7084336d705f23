# Switchboard on a CUDA machine: the `vllm` wheel brings its CUDA torch; the host needs
# the NVIDIA driver and container toolkit. Models come from the host's cache (mounted).
FROM python:3.11-slim
WORKDIR /srv/switchboard
COPY pyproject.toml README.md ./
COPY app ./app
COPY schemas ./schemas
COPY fbs ./fbs
RUN pip install --no-cache-dir ".[gpu]"
ENV HF_HUB_OFFLINE=1
# 8000: HTTP and websockets; 50051: native gRPC (Salience, Evergreen), on the same --host.
EXPOSE 8000 50051
ENTRYPOINT ["switchboard", "serve", "--host", "0.0.0.0", "--port", "8000", "--grpc-port", "50051"]
