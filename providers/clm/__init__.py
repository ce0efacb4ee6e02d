"""CLM: the Contrastive-LM/CLM-v0.1-8B projection head over Qwen3-8B embedding vectors; the
encoder is an OpenAI-compatible endpoint (`encoder_server`: the optional local one)."""
