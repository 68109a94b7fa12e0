"""Example tasks that ship with the executor."""
