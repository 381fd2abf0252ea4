# bash completion for poolshim (installed as share/bash-completion/completions/poolshim).
# Subcommands, their options (as each one's --help lists them) and, after the
# `--` of run and ab, the command and its own arguments.
# shellcheck disable=SC2207  # COMPREPLY=($(compgen ...)) is the completion idiom

# allocation logs (LOG.csv, LOG.csv.gz) and directories; cur is _poolshim's
_poolshim_logs()
{
    COMPREPLY=($(compgen -f -X '!*.csv' -- "$cur") $(compgen -f -X '!*.csv.gz' -- "$cur") $(compgen -d -- "$cur"))
}

_poolshim()
{
    local cur prev words cword
    if declare -F _init_completion >/dev/null; then
        _init_completion || return
    else
        cur=${COMP_WORDS[COMP_CWORD]}
        prev=${COMP_WORDS[COMP_CWORD - 1]}
        words=("${COMP_WORDS[@]}")
        cword=$COMP_CWORD
    fi

    local commands="run ab replay plot stats config top export version help"
    if [[ $cword -eq 1 ]]; then
        COMPREPLY=($(compgen -W "$commands --help --version" -- "$cur"))
        return
    fi

    local command=${words[1]} i
    # run/ab: after `--`, complete the command being run
    if [[ $command == run || $command == ab ]]; then
        for ((i = 2; i < cword; i++)); do
            if [[ ${words[i]} == -- ]]; then
                if declare -F _command_offset >/dev/null; then
                    _command_offset $((i + 1))
                elif [[ $cword -eq $((i + 1)) ]]; then
                    COMPREPLY=($(compgen -c -- "$cur"))
                else
                    COMPREPLY=($(compgen -f -- "$cur"))
                fi
                return
            fi
        done
    fi

    local opts=""
    case $command in
    run)
        case $prev in
        -c | --config) COMPREPLY=($(compgen -f -X '!*.ini' -- "$cur") $(compgen -d -- "$cur")); return ;;
        --stats-file | --log) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        -o | --option) return ;;
        esac
        opts="--config --option --stats --stats=text --stats=json --stats-file --log --sanitize --dry-run --help --"
        ;;
    ab)
        case $prev in
        -c | --config) COMPREPLY=($(compgen -f -X '!*.ini' -- "$cur") $(compgen -d -- "$cur")); return ;;
        -p | --plot | --render) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        -n | --runs) return ;;
        esac
        opts="--runs --config --json --plot --no-cupti --keep --render --help --"
        ;;
    replay)
        case $prev in
        -c | --config) COMPREPLY=($(compgen -f -X '!*.ini' -- "$cur") $(compgen -d -- "$cur")); return ;;
        -p | --plot) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        -s | --simulate) _poolshim_logs; COMPREPLY+=($(compgen -W "80GiB 141GiB" -- "$cur")); return ;;
        -g | --gpu-lag | -t | --title) return ;;
        esac
        opts="--config --simulate --gpu-lag --native --json --threads --breakdown --plot --title --help"
        ;;
    plot)
        case $prev in
        -o | --output) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        -c | --config) COMPREPLY=($(compgen -f -X '!*.ini' -- "$cur") $(compgen -d -- "$cur")); return ;;
        -s | --simulate | -g | --gpu-lag | -t | --title) return ;;
        esac
        opts="--output --title --config --simulate --gpu-lag --help"
        ;;
    export)
        case $prev in
        -m | --memory-viz) COMPREPLY=($(compgen -f -X '!*.pickle' -- "$cur") $(compgen -d -- "$cur")); return ;;
        -p | --perfetto) COMPREPLY=($(compgen -f -X '!*.json' -- "$cur") $(compgen -d -- "$cur")); return ;;
        -d | --device) COMPREPLY=($(compgen -W "0 1 2 3 4 5 6 7" -- "$cur")); return ;;
        esac
        opts="--memory-viz --perfetto --device --help"
        ;;
    stats)
        opts="--json --help"
        if [[ $cur != -* ]]; then
            COMPREPLY=($(compgen -f -X '!*.json' -- "$cur") $(compgen -d -- "$cur"))
            return
        fi
        ;;
    top)
        case $prev in
        --dir|--textfile) COMPREPLY=($(compgen -d -- "$cur")); return ;;
        --interval) return ;;
        esac
        opts="--once --json --prometheus --textfile --interval --all-users --dir --help"
        ;;
    config)
        case $prev in
        --file) COMPREPLY=($(compgen -f -X '!*.ini' -- "$cur") $(compgen -d -- "$cur")); return ;;
        --device) COMPREPLY=($(compgen -W "'*' 0 1 2 3 4 5 6 7" -- "$cur")); return ;;
        --options) return ;;
        esac
        opts="--file --options --device --check --help"
        if [[ $cur != -* ]]; then
            COMPREPLY=($(compgen -f -X '!*.ini' -- "$cur") $(compgen -d -- "$cur"))
            return
        fi
        ;;
    *)
        return
        ;;
    esac

    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    elif [[ $command == replay || $command == plot || $command == export ]]; then
        _poolshim_logs
    fi
} &&
    complete -F _poolshim poolshim
