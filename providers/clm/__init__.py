"""CLM: the CLM-v0.1-8B head over an OpenAI-compatible encoder (`encoder_server`: a local one)."""
