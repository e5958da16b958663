"""Starting, watching and stopping vLLM: the one launcher (launch.py) that serve and warmup use."""
