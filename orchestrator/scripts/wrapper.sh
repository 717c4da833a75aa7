#!/bin/sh
# orchestrator job wrapper: runs one job on a worker, with nothing but POSIX sh.
#
# Usage: sh wrapper.sh RUNFILE
# RUNFILE is a shell fragment written by the orchestrator (every value quoted)
# that sets ORCH_* variables, exports the user's environment and sets "$@" to
# the user's command. The wrapper writes the job log ($ORCH_OUTDIR/orch.log):
#   <time> START <pid>         the wrapper began
#   <time> <KEYWORD> <data>    written by the application through $ORCH_LOG
#   <time> EXIT <code>         the application's exit code
#   <time> END <code>          the wrapper finished
# and, when ORCH_NOTIFY names a file, one line "<key> START|END ..." there at
# start and end, so that a driver watches one file instead of every job's log.

. "$1" || exit 97

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
    if [ -n "${ORCH_NOTIFY:-}" ]; then
        orch_ts
        printf '%s %s %s\n' "$ORCH_KEY" "$*" "$_ts" >> "$ORCH_NOTIFY"
    fi
}

ORCH_JOBLOG="$ORCH_OUTDIR/orch.log"
export ORCH_HOME ORCH_MODE ORCH_RETRY_COUNT ORCH_JOBLOG ORCH_FQID ORCH_BOOT
export ORCH_LOG="$ORCH_BIN/orch-log"
export ORCH_STATE="$ORCH_BIN/orch-state"
orch_ts; echo "$_ts START $$" > "$ORCH_JOBLOG"
orch_notify START $$
# A run resumes from the last *saved* state: drop the state helper's unsaved changes of an earlier run
# (`[` is built in: no process unless there is something to remove).
if [ -f "$ORCH_HOME/.orch-state/work" ]; then rm -f "$ORCH_HOME/.orch-state/work"; fi

if cd "$ORCH_HOME" 2>>"$ORCH_JOBLOG"; then
    "$@" > "$ORCH_OUTDIR/stdout" 2> "$ORCH_OUTDIR/stderr" < /dev/null
    rc=$?
else
    rc=96
fi
orch_ts; echo "$_ts EXIT $rc" >> "$ORCH_JOBLOG"

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
                /*|..|../*|*/../*|*/..) orch_ts; echo "$_ts INFO refused output file $_f" >> "$ORCH_JOBLOG" ;;
                *) if [ -f "$_f" ]; then mv -f -- "$_f" "$ORCH_OUTDIR/"; fi ;;
            esac
        done
        set -f
    done
    set +f
    IFS=$_ifs
fi

# Files the application named with "$ORCH_LOG RETURN_FILE name": into the output
# dir, unless the name leaves the job's working directory (or is a link).
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
            *) if [ -L "$_rel" ]; then
                   orch_ts; echo "$_ts REFUSED $_f (a symbolic link)" >> "$ORCH_JOBLOG"
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
