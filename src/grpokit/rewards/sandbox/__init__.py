"""The code sandbox: untrusted Python (a model's completion) run in confined subprocesses.

- :mod:`~grpokit.rewards.sandbox.launcher` (this process): starts the other two, enforces the
  wall clock, reads the verdict; its ``run_python`` and ``sandbox_report`` are the API;
- :mod:`~grpokit.rewards.sandbox.runner` (a subprocess, run by file path): confines itself,
  then runs the program and answers the checker's calls;
- :mod:`~grpokit.rewards.sandbox.checker` (a subprocess, run by file path): runs a row's test
  code against the solution's answers and decides pass or fail;
- :mod:`~grpokit.rewards.sandbox.wire`: the plain-data protocol between the two subprocesses.

The subprocesses import only the standard library and ``wire`` from their own directory.
"""
