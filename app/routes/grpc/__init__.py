"""The native gRPC transport: the server the app's lifespan runs (`server`), what its
adapters share (`calls`), and the services: `salience.v1.Salience` (`salience`),
`evergreen.v2.EvergreenService` (`evergreen`) over the session layer, and SMG's gRPC
workers' `vllm.grpc.engine.VllmEngine` (`vllm_engine`).
"""
