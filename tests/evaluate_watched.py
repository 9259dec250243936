"""``python -m dreamer.evaluate`` with a look at the processes it starts: the parent of its
evaluation process, read once the episodes are played (the process then waits for more
until the runner's shutdown), and this command's forkserver with that server's parent.
Its last stdout line: ``processes: <evaluation's parent> <forkserver> <its parent> <pid>``."""

import os
import sys
from multiprocessing import forkserver

from dreamer import evaluate
from dreamer.evaluation.runner import EvalRunner
from tests.runs import parent

parents = []
played = EvalRunner.run


def run(self, step, policy):
    result = played(self, step, policy)
    parents.append(parent(self.process().pid))
    return result


if __name__ == "__main__":
    EvalRunner.run = run
    code = evaluate.main(sys.argv[1:])
    server = forkserver._forkserver._forkserver_pid
    print("processes:", *parents, server, server and parent(server), os.getpid())
    sys.exit(code)
