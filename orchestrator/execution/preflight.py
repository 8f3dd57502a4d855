"""The flag preflight: what a server's own `--help` predicts about a variant's flags, and
how far that prediction is trusted.

A refusal read from a help text is a prediction, never a verdict: help texts leave out
options (argparse's `help=SUPPRESS`, vLLM's `--no-enable-x`), page them (vLLM's `--help`
lists config groups and points to `--help=all`), or belong to a wrapper that hands unknown
flags to the real server (`parse_known_args`). So:

- `read_help` trusts a help to predict refusals only when it is a complete argparse help:
  an argparse usage line, option sections listing options, no pointer to a fuller help it
  could not follow, and no word of passing other flags through. vLLM's spellings
  (`--max_model_len`, `--compilation-config.level`, `-O3`) are accepted where its
  FlexibleArgumentParser shows itself.
- A predicted refusal is put to the server's own parser before anything restarts: a dry
  parse runs `EXEC FLAGS... --orchestrator-preflight-probe`. argparse reports ambiguous
  options and bad values while it parses and all unknown options together at the end, so
  a parser that refuses unknown flags exits 2 at argument parsing, never starting the
  server, naming the variant's flags it refuses (a refusal, in its own words) or only the
  probe (the prediction was wrong).
- A prediction the dry parse cannot settle is settled by the run itself: a start that dies
  at argument parsing confirms it (and is `invalid`, in the server's words).
- A prediction contradicted by the server (the dry parse takes the flags, or the run
  starts or dies elsewhere than at argument parsing) withdraws the trust in that
  executable's help for the rest of the campaign, said once.

The parsing and the prediction are pure; `Preflight` runs the commands (through the
function it is given) and holds the per-executable trust.
"""

from __future__ import annotations

import bisect
import difflib
import re
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.config.experiment import Experiment, option_word
from orchestrator.diagnosis.verdicts import Phase, Signature, Verdict
from orchestrator.errors import CommandTimeout
from orchestrator.execution.helpcache import HelpCache
from orchestrator.execution.transport.base import CommandResult

HELP_TIMEOUT = 180.0
#: A flag no server has, added to a dry parse (see Preflight._dry_parse).
PROBE = "--orchestrator-preflight-probe"

# ---------------------------------------------------------------------------------------
# argparse's decision on requested flags (pure)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlagProblem:
    """argparse's verdict on one requested flag that is not an exact match."""

    flag: str
    kind: Literal["unrecognized", "ambiguous", "abbreviation"]
    message: str  # argparse's own wording where argparse has one
    candidates: tuple[str, ...] = ()  # the matches, or the close matches

    @property
    def fatal(self) -> bool:
        """argparse refuses the command line (an abbreviation is accepted)."""
        return self.kind != "abbreviation"


#: unknown flags that get close matches suggested (see check_flags)
MAX_SUGGESTED = 20


def check_flags(
    requested: Iterable[str], accepted: Iterable[str], *, suggest: bool = True
) -> list[FlagProblem]:
    """What argparse (allow_abbrev=True, CPython 3.11-3.13) decides for each requested flag.

    Exact match: fine. A prefix of exactly one option: accepted as an abbreviation (still
    reported, because the server's next release may add a second match). A prefix of
    several: `ambiguous option: X could match A, B` (matches in the parser's order, the
    order of `accepted` when it is ordered). No match: `unrecognized arguments: X` with
    close matches (unless `suggest` is False: difflib is slow on long option lists).
    `requested` may carry `--flag=value` or bare `flag` names.
    """
    options = list(dict.fromkeys(accepted))
    if isinstance(accepted, (set, frozenset)):
        options.sort()  # no parser order to follow: at least be deterministic
    known = set(options)
    # prefix matches by bisection in a sorted copy, reported in the parser's order: the
    # check stays linear in the requested flags however long the help is
    order = {o: i for i, o in enumerate(options)}
    ranked = sorted(options)
    problems: list[FlagProblem] = []
    suggested = 0
    for raw in requested:
        arg = raw if raw.startswith("-") else f"--{raw}"
        name = arg.split("=", 1)[0]
        if arg in known or name in known:
            continue
        lo = bisect.bisect_left(ranked, name)
        hi = lo
        while hi < len(ranked) and ranked[hi].startswith(name):  # bounded by the options
            hi += 1
        matches = tuple(sorted(ranked[lo:hi], key=order.__getitem__))
        if len(matches) > 1:
            problems.append(
                FlagProblem(
                    name,
                    "ambiguous",
                    f"ambiguous option: {arg} could match {', '.join(matches)}",
                    matches,
                )
            )
        elif len(matches) == 1:
            problems.append(
                FlagProblem(
                    name,
                    "abbreviation",
                    f"{name} is accepted as an abbreviation of {matches[0]}",
                    matches,
                )
            )
        else:
            # close matches for the first few unknown flags only: difflib costs the whole
            # option list per flag, and nobody reads a thousand suggestions
            close = tuple(
                difflib.get_close_matches(name, options, n=3, cutoff=0.6)
                if suggest and suggested < MAX_SUGGESTED
                else ()
            )
            suggested += 1
            problems.append(
                FlagProblem(name, "unrecognized", f"unrecognized arguments: {name}", close)
            )
    return problems


# ---------------------------------------------------------------------------------------
# reading a help text (pure)
# ---------------------------------------------------------------------------------------

_USAGE_RE = re.compile(r"^usage: ")
_USAGE_LINE_RE = re.compile(r"^usage: ", re.MULTILINE)
# argparse indents a section's entries by two spaces (epilog examples such as vLLM's
# "   --json-arg.key1 value1" are indented otherwise, and are prose)
_INVOCATION_RE = re.compile(r"^  (-\S.*)$")
# argparse's section headers: "options:", "optional arguments:", "Frontend:", ...
_HEADER_RE = re.compile(r"^\S.*:\s*$")
#: A pointer to a fuller help: vLLM's "For full list: vllm serve --help=all".
_MORE_RE = re.compile(r"(?<![\w-])(--help(?:=|-)(?:all|full))(?![\w-])")
_QUAL = (
    r"(?:any|all|other|unknown|unrecogni[sz]ed|extra|additional|remaining|unlisted|"
    r"further|arbitrary|undeclared|unsupported)"
)
_NOUN = r"(?:flags?|options?|arguments?|args|parameters?|params|switches)"
_VERB = (
    r"(?:pass(?:ed|es)?|forward(?:ed|s)?|hand(?:ed|s)?|relay(?:ed|s)?|sent|given|"
    r"accepted|ignored|appended|propagated)"
)
#: Prose saying that flags the help does not list are passed on or accepted anyway.
_IN = r"(?:[^.;!?]|\.(?!\s|$))"  # within one sentence ("..." and "a.b" do not end it)
_PASSTHROUGH_RE = re.compile(
    rf"\b{_QUAL}\b{_IN}{{0,40}}?\b{_NOUN}\b{_IN}{{0,80}}?\b{_VERB}\b"
    rf"|\b{_NOUN}\b{_IN}{{0,60}}?\b(?:passed|forwarded|handed|relayed|sent|given|go|goes)\s+"
    r"(?:(?:on|along|through|verbatim|unchanged|as[- ]is)\s+)?to\b"
    r"|\bpass(?:es|ed|ing)?[- ]?through\b|\bparse_known_args\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class HelpFacts:
    """What one `--help` text says about the options a server accepts."""

    options: tuple[str, ...] = ()  # every option string listed, in the help's order
    switches: frozenset[str] = frozenset()  # listed without a value
    argparse: bool = False  # printed by argparse (its usage line and option sections)
    passthrough: bool = False  # says it accepts or passes on flags it does not list
    flexible: bool = False  # vLLM's FlexibleArgumentParser: `_` for `-`, dotted, -O<n>
    more: str | None = None  # the argument that prints the full list (`--help=all`)
    #: the option strings of each help entry (`--tensor-parallel-size, -tp`): one option
    groups: tuple[tuple[str, ...], ...] = ()

    @property
    def complete(self) -> bool:
        """Trusted to predict refusals: a full argparse help of a parser that refuses."""
        return (
            self.argparse
            and self.more is None
            and not self.passthrough
            and any(o not in ("-h", "--help") for o in self.options)
        )

    @property
    def why_not(self) -> str:
        """Why the help is not trusted to refuse flags (empty when it is)."""
        if not self.options and not self.argparse and self.more is None:
            return "it printed no options"
        if not self.argparse:
            return "it is not an argparse help"
        if self.passthrough:
            return "it says it passes flags it does not list through"
        if self.more is not None:
            return f"it lists only part of its options (the rest: {self.more})"
        if self.complete:
            return ""
        return "it lists no options"


def _invocation_options(invocation: str) -> list[tuple[str, bool]]:
    """`--tp-size TP_SIZE, --tp TP_SIZE` -> [("--tp-size", False), ("--tp", False)]."""
    out: list[tuple[str, bool]] = []
    for item in re.split(r",\s+(?=-)", invocation.strip()):
        words = item.split()
        if words and words[0].startswith("-") and len(words[0]) > 1:
            out.append((words[0], len(words) == 1))
    return out


def read_help(text: str) -> HelpFacts:
    """The facts of one `--help` output (leading log lines before `usage:` are skipped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _USAGE_RE.match(line)), None)
    more_m = _MORE_RE.search(text)
    more = more_m.group(1) if more_m else None
    if start is None:
        passthrough = bool(_PASSTHROUGH_RE.search(" ".join(lines)))
        return HelpFacts(passthrough=passthrough, more=more)
    usage = [lines[start]]
    j = start + 1
    while j < len(lines) and lines[j].strip() and lines[j][:1].isspace():
        usage.append(lines[j])
        j += 1
    found: dict[str, None] = {}
    switches: set[str] = set()
    groups: list[tuple[str, ...]] = []
    prose: list[str] = []
    sections = 0
    for line in lines[j:]:
        m = _INVOCATION_RE.match(line)
        if m:
            invocation = re.split(r"\s{2,}", m.group(1), maxsplit=1)[0]
            entry = _invocation_options(invocation)
            for opt, is_switch in entry:
                found.setdefault(opt, None)
                if is_switch:
                    switches.add(opt)
            if len(entry) > 1:
                groups.append(tuple(opt for opt, _ in entry))
            continue
        if _HEADER_RE.match(line):
            sections += 1
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent < 8:  # description, epilog, positionals; not the options' own help
            prose.append(line.strip())
    # The usage block names the options the sections show (unless the parser was given a
    # usage string of its own, as vLLM's "vllm serve [model_tag] [options]"); a usage block
    # alone (an error message's) still names them.
    for opt in re.findall(r"(?<![\w-])--?[A-Za-z0-9][\w.-]*", " ".join(usage)[len("usage: ") :]):
        found.setdefault(opt, None)
    joined = " ".join(prose)
    # argparse.REMAINDER prints as a bare "..." in the usage: it swallows any flags.
    remainder = bool(re.search(r"(?<![\w\]])\.\.\.(?![\w\]])", " ".join(usage)))
    flexible = (
        more is not None
        or bool(re.search(r"--[\w-]+\.[\w]+[ =]", joined))
        or "(_ or - accepted)" in text
    )
    return HelpFacts(
        options=tuple(found),
        switches=frozenset(switches),
        # a usage line alone (a getopt script's "usage: run.sh [-m model]") is no argparse help
        argparse=sections > 0,
        passthrough=remainder or bool(_PASSTHROUGH_RE.search(joined)),
        flexible=flexible,
        more=more,
        groups=tuple(groups),
    )


def follow(first: HelpFacts, full: HelpFacts) -> HelpFacts:
    """The facts of a paged help whose pointer (`--help=all`) printed `full`: the full
    page's options, and what either page says about pass-through and spellings. The full
    page may repeat the pointer (vLLM's does): it is followed once, not again."""
    return HelpFacts(
        options=full.options,
        switches=full.switches,
        argparse=full.argparse,
        passthrough=full.passthrough or first.passthrough,
        flexible=full.flexible or first.flexible,
        groups=full.groups,
    )


def _hidden_forms(facts_: HelpFacts) -> list[str]:
    """Spellings a FlexibleArgumentParser accepts but never lists: `--no-enable-x` and
    `--no-disable-x` of its `--enable-x, --disable-x` switches (vLLM keeps them for
    backward compatibility, hidden from help)."""
    out = []
    for opt in facts_.options:
        if opt.startswith(("--enable-", "--disable-")) and opt in facts_.switches:
            out.append("--no-" + opt[2:])
    return out


def normalize(token: str, flexible: bool) -> str:
    """The option a requested token names, as the parser would look it up.

    `--x=1` -> `--x`. With a FlexibleArgumentParser also `--max_model_len` ->
    `--max-model-len` and `--compilation-config.level` / `--cfg.list+` -> the base option.
    """
    name = token.split("=", 1)[0]
    if not flexible or not name.startswith("--"):
        return name
    base = name[2:].split(".", 1)[0].rstrip("+")
    return "--" + base.replace("_", "-")


def option_of(name: str, help_: HelpFacts) -> str | None:
    """The option a config's flag name (`max_num_seqs`, `max-num-batch`, `tp`) is to the
    server's parser, by the name its help lists first for it (`max-num-seqs`,
    `max-num-batched-tokens`, `tensor-parallel-size`); None when the help cannot tell
    (unknown, ambiguous, or a help that does not list every option).

    The parser's own rules: vLLM's `_` for `-`, an entry's aliases (`--tensor-parallel-size,
    -tp`), and argparse's unique prefixes. A negation stays itself: `--no-enable-x` is
    listed with `--enable-x` but says the opposite."""
    if not help_.complete:
        return None
    token = normalize(name if name.startswith("-") else f"--{name}", help_.flexible)
    longs = [o for o in help_.options if o.startswith("--")]
    hidden = _hidden_forms(help_) if help_.flexible else []
    if token in hidden or token.startswith("--no-"):
        return token[2:] if token in longs or token in hidden else None
    if token not in help_.options:
        matches = [o for o in longs if o.startswith(token) and not o.startswith("--no-")]
        if len(matches) != 1:
            return None
        token = matches[0]
    for group in help_.groups:
        if token in group:
            first = next(
                (o for o in group if o.startswith("--") and not o.startswith("--no-")), token
            )
            return first[2:] if first.startswith("--") else None
    return token[2:] if token.startswith("--") else None


def respell(exp: Experiment, help_: HelpFacts) -> tuple[Experiment, list[tuple[str, str]]]:
    """`exp` with each flag named as the server's parser reads it (see `option_of`), and
    the (as written, as read) pairs that changed. Two spellings of one option in one config
    keep the last value, as argparse does."""
    renamed: list[tuple[str, str]] = []
    flags: dict[str, object] = {}
    for key, value in exp.flags:
        name = option_of(key, help_) or key
        if name != key:
            renamed.append((key, name))
        flags.pop(name, None)
        flags[name] = value
    if not renamed:
        return exp, []
    from dataclasses import replace

    return replace(exp, flags=tuple(flags.items())), renamed  # type: ignore[arg-type]


def predict(
    help_: HelpFacts, requested: Iterable[str], *, suggest: bool = True
) -> list[FlagProblem]:
    """argparse's decision on each requested flag that is not a plain exact match, as far
    as the help tells (abbreviations included: they are accepted, `fatal` is False)."""
    longs = [o for o in help_.options if o.startswith("--")]
    if help_.flexible:
        longs += [o for o in _hidden_forms(help_) if o not in longs]
    shorts = [o for o in help_.options if not o.startswith("--")]
    problems: list[FlagProblem] = []
    pending: list[str] = []
    for raw in requested:
        token = raw if raw.startswith("-") else f"--{raw}"
        if token.startswith("--"):
            pending.append(normalize(token, help_.flexible))
            continue
        # a single-dash option: exact, or a one-letter option with its value attached
        # (`-O3`), or a prefix of single-dash options, as argparse matches them
        name = token.split("=", 1)[0]
        if name in shorts or name[:2] in shorts or (help_.flexible and name.startswith("-O")):
            continue
        matches = tuple(o for o in shorts if o.startswith(name))
        if len(matches) > 1:
            problems.append(
                FlagProblem(
                    name,
                    "ambiguous",
                    f"ambiguous option: {token} could match {', '.join(matches)}",
                    matches,
                )
            )
        elif not matches:
            problems.append(FlagProblem(name, "unrecognized", f"unrecognized arguments: {name}"))
    problems.extend(check_flags(pending, longs, suggest=suggest))
    return problems


# ---------------------------------------------------------------------------------------
# the server's own words
# ---------------------------------------------------------------------------------------

_ERROR_LINE_RE = re.compile(
    r"^(?:usage: .*\n(?:[ \t].*\n)*)?[\w./ -]+: error: (?P<msg>.+)$", re.MULTILINE
)


def parser_error(output: str) -> str | None:
    """argparse's complaint (`PROG: error: MESSAGE`) in a command's output, or None."""
    found = [m.group("msg").strip() for m in _ERROR_LINE_RE.finditer(output)]
    return found[-1] if found else None


def _without_probe(error: str) -> str:
    """argparse's complaint with the dry parse's own PROBE taken out ('' if only it)."""
    head, sep, rest = error.partition("unrecognized arguments:")
    if not sep:
        return error
    words = [w for w in rest.split() if w != PROBE]
    return f"{head}unrecognized arguments: {' '.join(words)}" if words else ""


def is_args_failure(verdict: Verdict, signature: Signature | None) -> bool:
    """A run that died at argument parsing: the server refused its command line."""
    return verdict is Verdict.INVALID and signature is not None and signature.phase is Phase.ARGS


def args_detail(log: str, signature: Signature | None, check: Check) -> str:
    """The detail of a run that died at argument parsing: the server's own words, then what
    the preflight had predicted (with its close matches), if anything."""
    words = parser_error(log) or (signature.message if signature else "")
    detail = f"the server rejects its command line: {words}"
    if check.predicted:
        detail += f" (predicted from its --help: {check.note})"
    return detail


def _hints(problems: Sequence[FlagProblem]) -> str:
    """` (did you mean --tp-size?)` for unknown flags with close matches, or ''."""
    close = [p for p in problems if p.kind == "unrecognized" and p.candidates]
    if not close:
        return ""
    if len(close) == 1:
        return " (did you mean " + " or ".join(close[0].candidates) + "?)"
    return (
        " (did you mean "
        + "; ".join(" or ".join(p.candidates) + f" for {p.flag}" for p in close)
        + "?)"
    )


def suggestions(problems: Sequence[FlagProblem]) -> str:
    """The preflight's reading of fatal problems, with close matches, for a detail line."""
    parts = []
    for p in problems:
        if not p.fatal:
            continue
        text = p.message
        if p.kind == "unrecognized" and p.candidates:
            text += " (did you mean " + " or ".join(p.candidates) + "?)"
        parts.append(text)
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------
# the stateful side: one per executor (one host, one campaign)
# ---------------------------------------------------------------------------------------

Runner = Callable[[str, float, str | None], CommandResult]  # command, timeout, stdin
Say = Callable[[str, dict[str, object]], None]


@dataclass(frozen=True)
class Check:
    """The preflight's answer for one variant."""

    refusal: str | None = None  # confirmed by the server's parser: invalid, nothing started
    predicted: tuple[FlagProblem, ...] = ()  # refusals the help predicts, not yet confirmed
    trusted: bool = False  # the predictions came from a help still trusted

    @property
    def note(self) -> str:
        return suggestions(self.predicted)


@dataclass
class _Help:
    facts: HelpFacts
    trusted: bool
    said: bool = False
    followed: str | None = None  # the argument whose output was read (`--help=all`)
    help_seconds: float = 0.0  # how long `--help` took (a dry parse takes about as long)
    notes: list[str] = field(default_factory=list)


class Preflight:
    """Reads each executable's help once, predicts, confirms, and withdraws trust."""

    def __init__(
        self, run: Runner, say: Say, *, cache: HelpCache | None = None, host: str = ""
    ) -> None:
        self._run = run
        self._say = say
        self._helps: dict[tuple[str, ...], _Help] = {}
        #: help pages kept per host and server build (orchestrator.execution.helpcache)
        self._cache = cache
        self._host = host
        #: how many help pages were read on the host (not from the cache)
        self.reads = 0
        #: the distrust already said: (reason, the executable or None for any build)
        self._said: set[tuple[str, tuple[str, ...] | None]] = set()

    # -- commands
    def _in_env(self, exp: Experiment, argv: list[str], timeout: float) -> CommandResult:
        """Run argv in the variant's working directory and environment. The environment
        goes through stdin, never the command line: every local user sees a command line
        (ps), and the environment may hold secrets."""
        env = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in exp.env)
        cmd = shlex.join(argv)
        if env:
            cmd = f". /dev/stdin && {cmd}"
        if exp.workdir:
            cmd = f"cd {shlex.quote(exp.workdir)} && {cmd}"
        return self._run(cmd, timeout, env or None)

    def _help_text(self, exp: Experiment, arg: str) -> tuple[str | None, str, float]:
        """(the output of `EXEC ARG`, or None when it failed or timed out; why it failed;
        how long it took)."""
        try:
            r = self._in_env(exp, [*exp.exec, arg], HELP_TIMEOUT)
        except CommandTimeout:
            return None, f"{arg} did not finish in {HELP_TIMEOUT:g}s", HELP_TIMEOUT
        if not r.ok:
            return None, f"{arg} exited {r.exit_code}", r.duration
        # argparse prints help on stdout; a few wrappers print theirs on stderr
        if not _USAGE_LINE_RE.search(r.stdout) and _USAGE_LINE_RE.search(r.stderr):
            return r.stderr, "", r.duration
        return r.stdout, "", r.duration

    def help_of(self, exp: Experiment, build: str | None = None) -> _Help:
        """The help of this variant's executable (read once, the fuller page followed; from
        the cache when this host's server `build` was read before)."""
        key = exp.exec
        if key in self._helps:
            return self._helps[key]
        cached = self._cache.get(self._host, key, build) if self._cache and build else None
        if cached is not None:
            text, why, seconds = cached["help"], "", float(cached.get("seconds") or 0.0)
        else:
            text, why, seconds = self._help_text(exp, "--help")
            self.reads += 1
        help_ = read_help(text or "")
        followed = None
        more_text: str | None = None
        if help_.more is not None:
            if cached is not None and cached.get("more_arg") == help_.more:
                more_text, more_why = cached.get("more"), ""
            else:
                more_text, more_why, more_seconds = self._help_text(exp, help_.more)
                self.reads += 1
                seconds = max(seconds, more_seconds)
            more = read_help(more_text or "")
            if more.options:
                followed = help_.more
                help_ = follow(help_, more)
            why = why or more_why
        if cached is None and self._cache and build and text is not None and not why:
            self._cache.put(
                self._host,
                key,
                build,
                {
                    "help": text,
                    "more_arg": followed,
                    "more": more_text if followed else None,
                    "seconds": seconds,
                },
            )
        entry = _Help(help_, trusted=help_.complete, followed=followed, help_seconds=seconds)
        self._helps[key] = entry
        if not entry.trusted:
            reason = why or help_.why_not
            # the builds of one server share their help's habits: said once for them all
            said = (reason, None if exp.build is not None else exp.exec)
            if said not in self._said:
                self._said.add(said)
                self._say(
                    f"{shlex.join(exp.exec)} --help is not trusted to refuse flags "
                    f"({reason}): flags are checked by the server itself, at each start"
                    + (" (said once for every build)" if exp.build is not None else ""),
                    {"kind": "help-untrusted", "reason": reason},
                )
        return entry

    def check(self, exp: Experiment, build: str | None = None) -> Check:
        """What the help predicts for this variant; a predicted refusal is put to the
        server's own parser (a dry parse, nothing started) before it counts."""
        entry = self.help_of(exp, build)
        if not entry.trusted:
            return Check()
        problems = tuple(
            p for p in predict(entry.facts, [option_word(k) for k, _ in exp.flags]) if p.fatal
        )
        if not problems:
            return Check()
        words = self._dry_parse(exp, entry, problems)
        if words is not None:
            return Check(
                refusal=f"the server rejects the flags: {words}{_hints(problems)}",
                predicted=problems,
                trusted=True,
            )
        if not entry.trusted:
            return Check()  # the dry parse contradicted the help: trust withdrawn
        return Check(predicted=problems, trusted=True)  # undecided: the run will tell

    def _dry_parse(
        self, exp: Experiment, entry: _Help, problems: Sequence[FlagProblem]
    ) -> str | None:
        """The server's own parser on this variant's command line plus PROBE, a flag no
        server has: argparse reports ambiguous options and bad values while parsing, and
        unknown options all together at the end, so a parser that refuses unknown options
        exits 2 without starting anything, naming everything it does not take. Returns its
        complaint without PROBE (the variant is refused), or None: it took the variant's
        flags (the help was wrong: trust withdrawn), or it said nothing argparse-like."""
        flags = ", ".join(p.flag for p in problems)
        # A parser exits about as fast as it prints its help; a program still running well
        # past that did not refuse the probe (it may be starting a server: stopped).
        timeout = min(HELP_TIMEOUT, max(30.0, 4 * entry.help_seconds))
        try:
            r = self._in_env(exp, [*exp.argv(), PROBE], timeout)
        except CommandTimeout:
            self._withdraw(
                exp,
                f"a dry parse with {flags} and an unknown flag was still "
                f"running after {timeout:g}s instead of refusing them",
            )
            return None
        error = parser_error(r.stderr + "\n" + r.stdout)
        if r.ok or (error is not None and not _without_probe(error)):
            self._withdraw(
                exp,
                f"its own parser took {flags} (a dry parse refused only "
                "the unknown flag added to it)"
                if not r.ok
                else f"its own parser took {flags} and even an unknown flag (a dry parse exited 0)",
            )
            return None
        if error is None:
            return None  # not argparse's words: the run will tell
        return _without_probe(error)

    # -- after a real start
    def settle(
        self,
        exp: Experiment,
        check: Check,
        verdict: Verdict,
        signature: Signature | None,
        run_id: str = "",
    ) -> None:
        """A run of a variant whose flags the help predicted refused: confirmed when it
        died at argument parsing, contradicted when it started (or died elsewhere)."""
        if not check.predicted or not check.trusted or check.refusal is not None:
            return
        if verdict is Verdict.INFRA or (verdict is Verdict.INVALID and signature is None):
            return  # nothing about the flags was learnt (host trouble, read-back mismatch)
        if is_args_failure(verdict, signature):
            return
        flags = ", ".join(p.flag for p in check.predicted)
        where = f" (run {run_id}: {verdict.value})" if run_id else f" ({verdict.value})"
        self._withdraw(exp, f"the server took {flags}{where}")

    def _withdraw(self, exp: Experiment, why: str) -> None:
        entry = self._helps.get(exp.exec)
        if entry is None or not entry.trusted:
            return
        entry.trusted = False
        if not entry.said:
            entry.said = True
            self._say(
                f"{shlex.join(exp.exec)} --help predicted a refusal the server did not "
                f"make: {why}; its help is no longer trusted to refuse flags in this "
                "campaign",
                {"kind": "help-distrusted", "reason": why},
            )

    def trusted(self, exp: Experiment) -> bool:
        entry = self._helps.get(exp.exec)
        return bool(entry and entry.trusted)
