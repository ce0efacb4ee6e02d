"""HTTP transport: the Litestar app (`app`) and the granian server that runs it (`server`)."""
