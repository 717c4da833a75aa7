#!/bin/sh
# orchestrator job wrapper: runs one job on a worker, with nothing but POSIX sh.
#
# Usage: sh wrapper.sh RUNFILE  |  sh wrapper.sh --env KEY COMMAND [ARGS...]
# RUNFILE is a shell fragment written by the orchestrator (every value quoted) that sets ORCH_* variables,
# exports the user's environment and sets "$@" to the user's command. With --env (local runs: no file per
# run) the same values come in the environment and the command in the arguments; KEY, the run's key, is
# there for ps and for a driver that looks for its wrapper after a crash.
# The log of this attempt is $ORCH_OUTDIR/orch.$ORCH_ATTEMPT.log (the orchestrator renames it orch.log once
# it has read it; a late line of an earlier attempt lands in that attempt's own file):
#   <time> START <pid>         the wrapper began
#   <time> <KEYWORD> <data>    written by the application through $ORCH_LOG
#   <time> EXIT <code>         the application's exit code
#   <time> NOMATCH <pattern>   a declared output file pattern that matched no file
#   <time> END <code>          the wrapper finished
# When ORCH_NOTIFY names a file, "<key> START|END ..." lines go there too, so that a driver follows one file.
# Each attempt appends its CPU record to $ORCH_OUTDIR/orch.usage (GBS's useful and wasted CPU) when its
# application ends or when SIGTERM stops it: "<attempt> <state started from> <newest state> <start> <end>
# <code>", then the shell's `times` (the wrapper's and its children's user and system time).
# The hot path starts one process, the application: the clock, the records and the checks are built-ins;
# output files and returned files are handled by orch-finish, read only when there are some.

if [ "${1:-}" = --env ]; then
    shift 2
    # The wrapper's own values came in the environment: the application sees them no more (as with a run file).
    _k=$ORCH_KEY _o=$ORCH_OUTDIR _b=$ORCH_BIN _f=${ORCH_OUTPUTFILES:-} _n=${ORCH_NOTIFY:-} _i=${ORCH_INPUTS:-}
    unset ORCH_KEY ORCH_OUTDIR ORCH_BIN ORCH_OUTPUTFILES ORCH_NOTIFY ORCH_INPUTS
    ORCH_KEY=$_k ORCH_OUTDIR=$_o ORCH_BIN=$_b ORCH_OUTPUTFILES=$_f ORCH_NOTIFY=$_n ORCH_INPUTS=$_i
else
    . "$1" || exit 97
fi

orch_ts() {
    # Sets $_ts to wall-clock seconds. /proc/uptime plus the boot time (set where /proc has both) costs
    # neither a process nor a subshell; `date` is the portable fallback.
    if [ -n "${ORCH_BOOT:-}" ] && IFS=" " read -r _up _idle < /proc/uptime; then
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
# the host it runs on, for sacct-like views (read, not a process: uname only where /proc has no hostname)
{ read -r _host < /proc/sys/kernel/hostname; } 2>/dev/null || _host=$(uname -n 2>/dev/null) || _host=-
orch_ts; echo "$_ts START $$ $_host" > "$ORCH_JOBLOG"
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

trap - TERM
orch_usage "$rc"
echo "$_ts EXIT $rc" >> "$ORCH_JOBLOG"

# The RETURN_FILE lines of the application's log ("$ORCH_LOG RETURN_FILE name").
# Each name as it was written, spaces and all: the line's first words cut off, not split (as the launcher reads it).
_returns=
while IFS= read -r _l; do
    case "${_l#* }" in
        "RETURN_FILE "*) _d=${_l#* RETURN_FILE }; _returns="$_returns$_d
" ;;
    esac
done < "$ORCH_JOBLOG"
# Declared output files and returned files go into the output dir: the rare part, in a file of its own that
# the shell reads only then.
if [ -n "${ORCH_OUTPUTFILES:-}" ] || [ -n "$_returns" ]; then
    . "$ORCH_BIN/orch-finish"
    orch_ts
fi

echo "$_ts END $rc" >> "$ORCH_JOBLOG"
orch_notify END "$rc"
exit "$rc"
