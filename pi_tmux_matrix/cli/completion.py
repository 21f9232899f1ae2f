"""``pi-matrix completion bash|zsh|fish``: shell completion generated from the parser itself, so it
cannot drift from the commands."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..errors import EXIT_OK
from .base import add_verb, public_verbs, store_of
from .names import Kind, candidates

if TYPE_CHECKING:
    from .base import Io, Verbs

__all__ = ["register", "verbs_and_options"]


def register(sub: Verbs, epilog: str) -> None:
    shells = 'bash: eval "$(pi-matrix completion bash)"   zsh: eval "$(pi-matrix completion zsh)"\n'
    completion = add_verb(sub, "completion", shells + "fish: pi-matrix completion fish | source\n\n" + epilog)
    completion.add_argument("shell", choices=["bash", "zsh", "fish"])
    completion.set_defaults(handler=cmd_completion)
    # Hidden (no help): what the completion scripts run to offer the keys and job ids on disk.
    names = add_verb(sub, "complete-names", epilog)
    names.add_argument("kinds", nargs="+", choices=[kind.value for kind in Kind])
    names.set_defaults(handler=cmd_complete_names)


# The positional a verb's first word names, by its metavar: the kinds of name completed for it.
_NAMED_BY = {"KEY": "entry", "ID": "job", "KEY|ID": "entry job", "RUN": "run"}


def named_kinds(parser: argparse.ArgumentParser) -> str | None:
    """The kinds of name (``entry``, ``job``) a verb's first positional takes, if any."""
    for action in parser._actions:
        if not action.option_strings and isinstance(action.metavar, str):
            return _NAMED_BY.get(action.metavar)
    return None


def verbs_and_options(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, list[str]]]:
    """Every verb and, per verb, its long options (the global ones under ``""``)."""
    options: dict[str, list[str]] = {
        "": [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    }
    verbs: list[str] = []
    for name, sub in public_verbs(parser):
        verbs.append(name)
        options[name] = sorted(o for a in sub._actions for o in a.option_strings if o.startswith("--"))
    return verbs, options


def _bash(verbs: list[str], options: dict[str, list[str]], named: dict[str, str]) -> str:
    cases = "\n".join(f'        {verb}) opts="{" ".join(options[verb])}" ;;' for verb in verbs)
    kinds = "\n".join(f'        {verb}) kinds="{kinds}" ;;' for verb, kinds in named.items())
    return f"""# pi-matrix completion for bash (and zsh via bashcompinit)
_pi_matrix() {{
    local cur verb i opts kinds state
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    verb=""
    state=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            --state-dir) state=(--state-dir "${{COMP_WORDS[i+1]}}"); ((i++)) ;;
            --*) ;;
            *) verb="${{COMP_WORDS[i]}}"; break ;;
        esac
    done
    if [[ -z "$verb" ]]; then
        COMPREPLY=($(compgen -W "{" ".join(verbs)} {" ".join(options[""])}" -- "$cur"))
        return
    fi
    case "$verb" in
{cases}
        *) opts="" ;;
    esac
    kinds=""
    case "$verb" in
{kinds}
    esac
    if [[ -n "$kinds" && "$cur" != -* ]]; then
        # The keys and job ids in the state dir, read by pi-matrix itself (nothing is written).
        opts="$(pi-matrix "${{state[@]}}" complete-names $kinds 2>/dev/null)"
    fi
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}}
complete -o default -F _pi_matrix pi-matrix
"""


def _fish(verbs: list[str], options: dict[str, list[str]], named: dict[str, str]) -> str:
    lines = ["# pi-matrix completion for fish", "complete -c pi-matrix -f"]
    lines.append(f"complete -c pi-matrix -n __fish_use_subcommand -a '{' '.join(verbs)}'")
    for verb, kinds in named.items():
        lines.append(
            f"complete -c pi-matrix -n '__fish_seen_subcommand_from {verb}' "
            f"-a '(pi-matrix complete-names {kinds} 2>/dev/null)'"
        )
    for verb in verbs:
        for option in options[verb]:
            lines.append(f"complete -c pi-matrix -n '__fish_seen_subcommand_from {verb}' -l {option[2:]}")
    return "\n".join(lines) + "\n"


def cmd_completion(args: argparse.Namespace, io: Io) -> int:
    verbs, options = verbs_and_options(args.parser)
    named = {name: kinds for name, sub in public_verbs(args.parser) if (kinds := named_kinds(sub))}
    if args.shell == "fish":
        io.out.write(_fish(verbs, options, named))
    elif args.shell == "zsh":
        io.out.write("autoload -U +X bashcompinit && bashcompinit\n" + _bash(verbs, options, named))
    else:
        io.out.write(_bash(verbs, options, named))
    return EXIT_OK


def cmd_complete_names(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix complete-names entry|job…`` (hidden): one name a line, for the shell."""
    found = candidates(store_of(args), [Kind(kind) for kind in args.kinds])
    io.out.write("".join(name + "\n" for name in found))
    return EXIT_OK
