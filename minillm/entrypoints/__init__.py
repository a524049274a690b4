"""How people reach the engine from outside Python code: the terminal chat (`python -m minillm.chat`)."""
