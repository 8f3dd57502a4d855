"""Real hosts for the test suite: a private OpenSSH sshd and a systemd container.

`tests/conftest.py` exposes the fixtures defined in `tests.hosts.fixtures`:

- `sshd` (session): `orchestrator.lab.sshd.SshdEndpoint` of an sshd on 127.0.0.1 (random
  port, throwaway keys, known_hosts checked); `sshd_server` (session) is its controller
  with `restart()` for connection-drop tests.
- `systemd_host` (per test): `orchestrator.lab.sdhosts.SystemdHost`, a Debian container booted
  with systemd-nspawn in its own network namespace, reached as root over SSH on port 22;
  `systemd_hosts` (session) boots more of them (`.boot()`), e.g. for pools.

Helpers: `tests.hosts.target.SshTarget` (ssh argv with host key checking, `ssh_run`,
hosts.yaml rendering), `tests.hosts.wait.wait_until` (bounded polling),
`tests.hosts.prereq` (skip with a reason, or fail under CI=true).
"""
