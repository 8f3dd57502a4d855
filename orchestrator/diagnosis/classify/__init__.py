"""Classification: from a server's log tail and a run's outcome to a verdict and a signature.

Pure and table-driven. The knowledge lives in tables:

- `orchestrator.diagnosis.server_logs`: per server (SGLang, vLLM), the startup milestones (the log's
  own progress), the functions that say which startup phase a traceback was raised in,
  and which paths are the server's own code;
- `rules.ERROR_RULES`: regex rules naming an error class and its key message; the first
  rule (by priority) that matches an exception's text wins. Adding an error class is one line;
- `rules.WRAPPER_TYPES` / `rules.WRAPPER_MESSAGES`: exceptions that only report another one
  (vLLM's `EngineDeadError`, "Worker failed with error ...", "Engine core initialization
  failed"): never the root of a failure.

The modules, each read on its own, in the order a log goes through them:

- `lines`: a line without its prefixes (timestamps, ranks, worker tags), the startup phase
  it marks, and which lines of a huge log are read at all;
- `normalize`: what varies between ranks, days, hosts and installs taken out of a message;
- `rules`: the rule table above and `classify_error`, which applies it to one exception;
- `tracebacks`: the errors a log shows (by process, chained or not), their frames, stack
  dumps of a hang, and the place in the server's own code;
- `analyze`: `analyze_log`, which puts those together;
- `judge`: a whole run's evidence to a verdict; the only part the executors import.

`analyze_log(text)` finds the root failure of a log: the first real error (in a chained
traceback the cause prints first; ranks that die because a peer died print later), with
hangs and timeouts (scheduler and NCCL watchdogs, RPC and engine-startup timeouts) as
failures too. Its signature is phase + error class + normalized key message + the place:
the innermost frame in the server's own code (file and function, never a line number), or
for a hang the innermost own frame of the stuck thread when a stack dump shows it. Generic
messages ("an illegal memory access was encountered") from different kernels thus stay
apart, and every number, address, id and path is normalized so reruns stay together.

A text that is not a server log at all (empty, binary, a shell error, megabytes of
warnings) gets a plain answer (`LogAnalysis.note`) in bounded time: huge logs are read
whole only near their end; earlier parts only where an error or milestone shows.

`judge(evidence, target)` turns a whole run's evidence into a `Verdict`.
Nothing here does I/O or prints; the CLI and the executor feed it text.
"""
