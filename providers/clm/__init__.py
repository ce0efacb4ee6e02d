"""CLM: the Contrastive-LM/CLM-v0.1-8B projection head over Qwen3-8B embedding vectors.

`render` (upstream's texts) is read by both processes. Gateway side: `encoder_client` (the
embeddings endpoint, cached candidate vectors) and `provider`. Worker side: `head` and `engine`
(torch). `encoder_server` is the optional local `decidealot encoder` process.
"""
