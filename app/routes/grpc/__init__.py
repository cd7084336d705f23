"""The native gRPC transport: the server the app's lifespan runs (`server`), what its
adapters share (`calls`), and the published services over the session layer:
`salience.v1.Salience` (`salience`) and `evergreen.v2.EvergreenService` (`evergreen`)."""
