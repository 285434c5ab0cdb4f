"""Exception type raised for every user-facing input or configuration problem."""


class PwanInputError(ValueError):
    """Invalid point sets, configuration values or files.

    Raised instead of returning a silently wrong answer; the CLI turns it into an error message
    and a non-zero exit status.
    """
