"""``pi-matrix completion bash|zsh|fish``: shell completion generated from the parser itself, so it
cannot drift from the commands."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..errors import EXIT_OK
from .base import public_verbs

if TYPE_CHECKING:
    from .base import Io

__all__ = ["register", "verbs_and_options"]


def register(sub: Any, epilog: str) -> None:
    completion = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh or fish)",
        epilog='bash: eval "$(pi-matrix completion bash)"   zsh: eval "$(pi-matrix completion zsh)"\n'
        "fish: pi-matrix completion fish | source\n\n" + epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    completion.add_argument("shell", choices=["bash", "zsh", "fish"])
    completion.set_defaults(handler=cmd_completion)


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


def _bash(verbs: list[str], options: dict[str, list[str]]) -> str:
    cases = "\n".join(f'        {verb}) opts="{" ".join(options[verb])}" ;;' for verb in verbs)
    return f"""# pi-matrix completion for bash (and zsh via bashcompinit)
_pi_matrix() {{
    local cur verb i opts
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    verb=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            --state-dir) ((i++)) ;;
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
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}}
complete -o default -F _pi_matrix pi-matrix
"""


def _fish(verbs: list[str], options: dict[str, list[str]]) -> str:
    lines = ["# pi-matrix completion for fish", "complete -c pi-matrix -f"]
    lines.append(f"complete -c pi-matrix -n __fish_use_subcommand -a '{' '.join(verbs)}'")
    for verb in verbs:
        for option in options[verb]:
            lines.append(f"complete -c pi-matrix -n '__fish_seen_subcommand_from {verb}' -l {option[2:]}")
    return "\n".join(lines) + "\n"


def cmd_completion(args: argparse.Namespace, io: Io) -> int:
    verbs, options = verbs_and_options(args.parser)
    if args.shell == "fish":
        io.out.write(_fish(verbs, options))
    elif args.shell == "zsh":
        io.out.write("autoload -U +X bashcompinit && bashcompinit\n" + _bash(verbs, options))
    else:
        io.out.write(_bash(verbs, options))
    return EXIT_OK
