# vLLM's router (vllm-router, a Rust binary in its PyPI wheel), pinned as the project's
# tests run it (pyproject.toml's dev extra).
FROM python:3.11-slim
RUN pip install --no-cache-dir "vllm-router==0.1.17"
ENTRYPOINT ["vllm-router"]
