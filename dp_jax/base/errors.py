"""The one exception type for bad user input: its message is the whole, one-line report."""


class UserError(Exception):
  """Bad input (config, file, value): the message says what is wrong and how to fix it."""
