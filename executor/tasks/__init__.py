"""Example tasks that ship with the executor: users of the framework, written as a user writes a task.

`import executor.tasks.spirals` (in a gin file) registers a task's configurables. spirals, reverse and shared: small
MLP and GRU tasks; images: a residual CNN; keras_digits: a compiled Keras model; lm: a Transformer language model.
"""
