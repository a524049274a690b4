"""The engine: sequences, the block manager, the scheduler, the model runner and the loop that drives them."""
