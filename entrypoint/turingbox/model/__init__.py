"""The models turingbox serves: the built-in demo (demo, tokenizer) and models by Hugging Face id (hub)."""
