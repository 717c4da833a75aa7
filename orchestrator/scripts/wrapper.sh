#!/bin/sh
# orchestrator job wrapper: runs one job on a worker, with nothing but POSIX sh.
#
# Usage: sh wrapper.sh RUNFILE
#    or: sh wrapper.sh --env KEY COMMAND [ARGS...]
# RUNFILE is a shell fragment written by the orchestrator (every value quoted)
# that sets ORCH_* variables, exports the user's environment and sets "$@" to
# the user's command. With --env (the local backend: no file per run) the same
# ORCH_* values and the user's environment come in the environment, and the
# command in the arguments; KEY is the run's key, there for ps and for the
# driver that looks for its wrapper after a crash. The wrapper writes the job
# log of this attempt, $ORCH_OUTDIR/orch.$ORCH_ATTEMPT.log (renamed orch.log by
# the orchestrator once it has read it, after the run ended; a late line of an
# earlier attempt whose process outlived it lands in that attempt's own file,
# never in this one's):
#   <time> START <pid>         the wrapper began
#   <time> <KEYWORD> <data>    written by the application through $ORCH_LOG
#   <time> EXIT <code>         the application's exit code
#   <time> END <code>          the wrapper finished
# and, when ORCH_NOTIFY names a file, one line "<key> START|END ..." there at
# start and end, so that a driver watches one file instead of every job's log.
# Each attempt also appends its own CPU record to $ORCH_OUTDIR/orch.usage (GBS's
# useful and wasted CPU), when its application ends or when it is stopped by
# SIGTERM: "<attempt> <state it started from> <newest state> <start> <end> <code>"
# then the output of the shell's built-in `times` (two lines: the wrapper's and
# its children's user and system time).
# The hot path starts one process, the application: the clock, the records and
# the checks are built-ins (no `date`, no subshell).

if [ "${1:-}" = --env ]; then
    shift 2
    # The wrapper's own values came in the environment: the application sees them no more (as with a run file).
    _k=$ORCH_KEY _o=$ORCH_OUTDIR _b=$ORCH_BIN _f=${ORCH_OUTPUTFILES:-} _n=${ORCH_NOTIFY:-}
    unset ORCH_KEY ORCH_OUTDIR ORCH_BIN ORCH_OUTPUTFILES ORCH_NOTIFY
    ORCH_KEY=$_k ORCH_OUTDIR=$_o ORCH_BIN=$_b ORCH_OUTPUTFILES=$_f ORCH_NOTIFY=$_n
else
    . "$1" || exit 97
fi

orch_ts() {
    # Sets $_ts to wall-clock seconds. /proc/uptime plus the boot time costs
    # neither a process nor a subshell; `date` is the portable fallback.
    if [ -n "${ORCH_BOOT:-}" ] && IFS=" " read -r _up _idle < /proc/uptime 2>/dev/null; then
        _ts="$((ORCH_BOOT + ${_up%.*})).${_up#*.}"
    else
        _ts=$(date +%s)
    fi
}
orch_notify() {
    # At the time the clock was read last ($_ts).
    if [ -n "${ORCH_NOTIFY:-}" ]; then
        printf '%s %s %s\n' "$ORCH_KEY" "$*" "$_ts" >> "$ORCH_NOTIFY"
    fi
}

ORCH_JOBLOG="$ORCH_OUTDIR/orch.${ORCH_ATTEMPT:-0}.log"
export ORCH_HOME ORCH_MODE ORCH_RETRY_COUNT ORCH_ATTEMPT ORCH_JOBLOG ORCH_FQID ORCH_BOOT
export ORCH_LOG="$ORCH_BIN/orch-log"
export ORCH_STATE="$ORCH_BIN/orch-state"
orch_ts; echo "$_ts START $$" > "$ORCH_JOBLOG"
_t0=$_ts
orch_notify START $$
_from=0
if [ -f "$ORCH_HOME/.orch-state/current" ]; then read -r _from < "$ORCH_HOME/.orch-state/current"; fi
orch_usage() {
    # Built-ins only ({ } groups without a subshell): no process is started for the record.
    _to=$_from
    if [ -f "$ORCH_HOME/.orch-state/current" ]; then read -r _to < "$ORCH_HOME/.orch-state/current"; fi
    orch_ts
    { printf '%s %s %s %s %s %s\n' "${ORCH_ATTEMPT:-0}" "${_from:-0}" "${_to:-0}" "$_t0" "$_ts" "$1"; times; } \
        >> "$ORCH_OUTDIR/orch.usage" 2>/dev/null
}
# Stopped from outside (a kill, a batch system's preemption): the application got the signal too (same
# process group); once it has ended, the attempt's CPU is recorded and the wrapper ends without END.
trap 'orch_usage 143; exit 143' TERM
# A run resumes from the last *saved* state: drop the state helper's unsaved changes of an earlier run
# (`[` is built in: no process unless there is something to remove).
if [ -f "$ORCH_HOME/.orch-state/work" ]; then rm -f "$ORCH_HOME/.orch-state/work"; fi

if cd -P "$ORCH_HOME" 2>>"$ORCH_JOBLOG"; then
    _home=$PWD
    "$@" > "$ORCH_OUTDIR/stdout" 2> "$ORCH_OUTDIR/stderr" < /dev/null
    rc=$?
else
    _home=/nonexistent
    rc=96
fi

orch_inside() {
    # True when $1 (relative to the work dir) is a file of the job's own directory: its directory,
    # resolved through every symbolic link on the way, is the work dir or below, and it is no link itself.
    if [ -L "$1" ]; then return 1; fi
    case "$1" in */*) _d=${1%/*} ;; *) return 0 ;; esac
    _d=$(cd -P -- "$_d" 2>/dev/null && pwd -P) || return 1
    case "$_d/" in "$_home"/*) return 0 ;; esac
    return 1
}
trap - TERM
orch_usage "$rc"
echo "$_ts EXIT $rc" >> "$ORCH_JOBLOG"

# Keep the declared output files: move them from the work dir to the output dir.
if [ -n "${ORCH_OUTPUTFILES:-}" ]; then
    # One pattern per line; split on newlines only, glob each pattern on its own.
    _ifs=$IFS
    IFS='
'
    set -f
    for _pattern in $ORCH_OUTPUTFILES; do
        set +f
        for _f in $_pattern; do
            case "$_f" in
                /*|..|../*|*/../*|*/..) orch_ts; echo "$_ts REFUSED $_f (outside the job directory)" >> "$ORCH_JOBLOG" ;;
                *) if [ -f "$_f" ] || [ -L "$_f" ]; then
                       if orch_inside "$_f"; then
                           mv -f -- "$_f" "$ORCH_OUTDIR/"
                       else
                           orch_ts; echo "$_ts REFUSED $_f (leaves the job directory)" >> "$ORCH_JOBLOG"
                       fi
                   fi ;;
            esac
        done
        set -f
    done
    set +f
    IFS=$_ifs
fi

# Files the application named with "$ORCH_LOG RETURN_FILE name": into the output
# dir, unless the name leaves the job's working directory (through "..", an
# absolute path, or a symbolic link anywhere on the way) or is a link itself.
_returns=
while IFS=" " read -r _t _w _d; do
    if [ "$_w" = RETURN_FILE ]; then
        _returns="$_returns$_d
"
    fi
done < "$ORCH_JOBLOG"
if [ -n "$_returns" ]; then
    _ifs=$IFS
    IFS='
'
    for _f in $_returns; do
        case "$_f" in
            "$ORCH_HOME"/*) _rel=${_f#"$ORCH_HOME"/} ;;
            *) _rel=$_f ;;
        esac
        case "$_rel" in
            ''|/*|..|../*|*/../*|*/..) orch_ts; echo "$_ts REFUSED $_f (outside the job directory)" >> "$ORCH_JOBLOG" ;;
            *) if ! orch_inside "$_rel"; then
                   orch_ts; echo "$_ts REFUSED $_f (leaves the job directory)" >> "$ORCH_JOBLOG"
               elif [ -f "$_rel" ]; then
                   mv -f -- "$_rel" "$ORCH_OUTDIR/"
               else
                   orch_ts; echo "$_ts INFO RETURN_FILE $_f not found" >> "$ORCH_JOBLOG"
               fi ;;
        esac
    done
    IFS=$_ifs
fi

orch_ts; echo "$_ts END $rc" >> "$ORCH_JOBLOG"
orch_notify END "$rc"
exit "$rc"
