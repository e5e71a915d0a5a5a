# The one exception a host command raises for a user's mistake or a failed
# precondition; tasks.py turns it into "kv <task>: message" and a non-zero exit.


class UserError(Exception):
    # message: one line for the user; code: the process exit status
    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code  # 2: bad input (usage, profile); 1: the operation failed
