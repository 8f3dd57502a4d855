#!/usr/bin/env python3
"""Build (once) the Debian rootfs that systemd-nspawn boots: the systemd lab host
(`orchestrator lab up --systemd`) and the tests' `systemd_host` fixture use the same image.

Usage: scripts/build-rootfs [--force] [--print-path]   (or python3 orchestrator/lab/rootfs.py)

The rootfs is made with debootstrap from the Debian mirror this machine's APT already uses
(the only package registry the test machines can reach), configured for tests (see
`configure()`), and cached as a tarball OUTSIDE the repo:

    ${ORCH_ROOTFS_CACHE:-/var/cache/orchestrator-tests}/rootfs-<recipe hash>.tar.zst

The recipe hash is the sha256 of this file, so editing the recipe (packages, configuration)
builds a new tarball and a cached one is never stale. Running it again when the tarball
exists does nothing but print its path: the fixture and `lab up --systemd` call it every time.
Progress goes to stderr; the last line on stdout is the tarball's path.

Besides root (key login for the tests), the image has a login user `ubuntu` with
passwordless sudo, so the lab host is reached the way a real GPU host is (`sudo: true`).

Needs root, debootstrap and zstd (`scripts/bootstrap` installs them). Stdlib only: it runs
before the virtualenv exists (scripts/build-rootfs runs this file).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUITE = "bookworm"
PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-yaml",
    "curl",
    "iproute2",
    "procps",
    "sudo",
    # vLLM's CPU kernels (vllm._C) link libnuma: the lab's real vLLM unit (lab up --vllm)
    "libnuma1",
]
#: the unprivileged login user of the image (`sudo -n` works for it, as on a GPU host)
LOGIN_USER = "ubuntu"
HOSTNAME = "orch-systemd-host"
# Units that only slow a container boot down or wait for hardware/terminals that do not
# exist here. getty units in particular: nspawn without a TTY leaves console-getty spinning.
MASKED_UNITS = [
    "console-getty.service",
    "getty@.service",
    "serial-getty@.service",
    "container-getty@.service",
    "getty.target",
    "systemd-firstboot.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "dpkg-db-backup.timer",
    "systemd-networkd-wait-online.service",
    "systemd-timesyncd.service",
    "cron.service",
]
# sshd settings for the tests; sshd_config's first value wins, and Debian's sshd_config
# includes sshd_config.d/*.conf at its top, so these override the defaults.
SSHD_CONF = """\
# Test host: key login for root only, no PAM (no logind/session setup to wait for).
UsePAM no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
HostKey /etc/ssh/ssh_host_ed25519_key
# The fixture bind-mounts its session's client public key here (read-only).
AuthorizedKeysFile .ssh/authorized_keys /etc/ssh/orch_authorized_keys
"""


def log(msg: str) -> None:
    print(f"build-rootfs: {msg}", file=sys.stderr, flush=True)


def recipe_hash() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("ORCH_ROOTFS_CACHE") or "/var/cache/orchestrator-tests")


def tarball_path() -> Path:
    return cache_dir() / f"rootfs-{SUITE}-{recipe_hash()}.tar.zst"


def debian_mirror() -> str:
    """The Debian archive URI from APT's sources (one-line and deb822 formats)."""
    if os.environ.get("ORCH_DEBIAN_MIRROR"):
        return os.environ["ORCH_DEBIAN_MIRROR"]
    files = ["/etc/apt/sources.list"]
    files += sorted(glob.glob("/etc/apt/sources.list.d/*.list"))
    files += sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))
    candidates: list[str] = []
    for f in files:
        try:
            text = Path(f).read_text()
        except OSError:
            continue
        if f.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(
                    (m.group(1).lower(), m.group(2).strip())
                    for m in re.finditer(r"^([A-Za-z-]+):\s*(.*)$", stanza, re.M)
                )
                if "deb" not in fields.get("types", "").split():
                    continue
                if fields.get("enabled", "yes").lower() == "no":
                    continue
                if SUITE in fields.get("suites", "").split():
                    candidates += fields.get("uris", "").split()
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb" and words[2] == SUITE:
                    candidates.append(words[1])
    # Prefer the main archive over security/updates mirrors listed with the same suite.
    for uri in candidates:
        if "security" not in uri:
            return uri
    raise SystemExit(
        f"build-rootfs: no Debian '{SUITE}' mirror found in /etc/apt/sources.list(.d); "
        "set ORCH_DEBIAN_MIRROR=http://.../debian"
    )


def run(argv: list[str], **kw: object) -> None:
    subprocess.run(argv, check=True, **kw)  # type: ignore[call-overload]


def configure(root: Path) -> None:
    """Turn a fresh debootstrap tree into a test host that boots fast and takes our key."""
    (root / "etc/hostname").write_text(HOSTNAME + "\n")
    (root / "etc/hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {HOSTNAME}\n")
    # A fixed machine-id: an empty one makes systemd treat each boot as a first boot
    # (ConditionFirstBoot units, firstboot prompts on the console).
    (root / "etc/machine-id").write_text(hashlib.md5(recipe_hash().encode()).hexdigest() + "\n")
    for unit in MASKED_UNITS:
        link = root / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    # Journal in memory: nothing to flush at shutdown, and every boot starts empty.
    jd = root / "etc/systemd/journald.conf.d"
    jd.mkdir(parents=True, exist_ok=True)
    (jd / "orch-test.conf").write_text("[Journal]\nStorage=volatile\nRateLimitBurst=0\n")
    # Short stop timeouts: a unit that ignores SIGTERM must not hold a container stop
    # for the default 90 s.
    sd = root / "etc/systemd/system.conf.d"
    sd.mkdir(parents=True, exist_ok=True)
    (sd / "orch-test.conf").write_text("[Manager]\nDefaultTimeoutStopSec=10s\n")
    # sshd: one throwaway ed25519 host key, generated here and shipped in the tarball so
    # the fixture can write a known_hosts line from it (host keys are always checked).
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            f"root@{HOSTNAME}",
            "-f",
            str(root / "etc/ssh/ssh_host_ed25519_key"),
        ]
    )
    (root / "etc/ssh/sshd_config.d").mkdir(exist_ok=True)
    (root / "etc/ssh/sshd_config.d/orch-test.conf").write_text(SSHD_CONF)
    (root / "etc/ssh/orch_authorized_keys").write_text("")  # bind-mount target
    # With UsePAM no, OpenSSH refuses accounts whose password starts with '!' (locked);
    # '*' means "no password" but still allows keys.
    run(["chroot", str(root), "usermod", "-p", "*", "root"])
    run(
        [
            "chroot",
            str(root),
            "useradd",
            "--create-home",
            "--shell",
            "/bin/bash",
            "--password",
            "*",
            LOGIN_USER,
        ]
    )
    sudoers = root / "etc/sudoers.d" / LOGIN_USER
    sudoers.write_text(f"{LOGIN_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    sudoers.chmod(0o440)
    (root / "root/.ssh").mkdir(mode=0o700, exist_ok=True)
    wants = root / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    if not (wants / "ssh.service").exists():
        (wants / "ssh.service").symlink_to("/lib/systemd/system/ssh.service")
    # The project is bind-mounted here read-only by the fixture.
    (root / "opt/orchestrator").mkdir(parents=True, exist_ok=True)
    # Smaller tarball; the container never installs packages.
    for d in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (root / d).glob("*"):
            if p.is_file():
                p.unlink()


def build(dest: Path) -> None:
    if os.geteuid() != 0:
        raise SystemExit("build-rootfs: must run as root (debootstrap, chroot)")
    for tool in ("debootstrap", "zstd", "ssh-keygen"):
        if not shutil.which(tool):
            raise SystemExit(f"build-rootfs: '{tool}' not found; run scripts/bootstrap as root")
    mirror = debian_mirror()
    dest.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    # Work beside the destination so the final rename is atomic, and clean up on any error.
    with tempfile.TemporaryDirectory(prefix=".build-", dir=dest.parent) as work:
        root = Path(work) / "root"
        log(f"debootstrap {SUITE} from {mirror} into {root} (about a minute)")
        argv = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
        ]
        keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
        if Path(keyring).exists():
            argv.append(f"--keyring={keyring}")
        argv += [SUITE, str(root), mirror]
        try:
            run(argv, stdout=sys.stderr)
        except subprocess.CalledProcessError:
            debootstrap_log = root / "debootstrap/debootstrap.log"
            if debootstrap_log.exists():
                sys.stderr.write(debootstrap_log.read_text()[-4000:])
            raise
        log(f"debootstrap done in {time.monotonic() - t0:.0f}s; configuring")
        configure(root)
        log(f"packing {dest.name}")
        tmp = Path(work) / "rootfs.tar.zst"
        with open(tmp, "wb") as out:
            tar = subprocess.Popen(
                ["tar", "-C", str(root), "--numeric-owner", "--xattrs", "-cf", "-", "."],
                stdout=subprocess.PIPE,
            )
            assert tar.stdout is not None
            zst = subprocess.run(["zstd", "-q", "-T0", "-3"], stdin=tar.stdout, stdout=out)
            tar.stdout.close()
            if tar.wait() != 0 or zst.returncode != 0:
                raise SystemExit("build-rootfs: packing the rootfs failed")
        shutil.copy(root / "etc/ssh/ssh_host_ed25519_key.pub", str(dest) + ".hostkey.pub")
        os.replace(tmp, dest)
    log(f"built {dest} ({dest.stat().st_size // 2**20} MiB) in {time.monotonic() - t0:.0f}s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when cached")
    ap.add_argument("--print-path", action="store_true", help="print the tarball path only")
    args = ap.parse_args()
    dest = tarball_path()
    if args.print_path:
        print(dest)
        return 0
    if dest.exists() and not args.force:
        log(f"cached: {dest}")
    else:
        # Tarballs of older recipes are left alone: another checkout may still use them.
        build(dest)
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
