# Sourced by the setup scripts.

# logged NAME CMD...: an install step's output goes to build/NAME.log, so the terminal shows one line per
# environment; when the step fails, the log's last lines say why.
logged() {
  local log="build/$1.log" rc=0
  shift
  mkdir -p build
  echo "\$ $*" >>"$log"
  "$@" >>"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "failed ($rc): $*; the last lines of $log:" >&2
    tail -n 25 "$log" >&2
  fi
  return "$rc"
}

# need_disk GB WHAT: stops before pip fills the disk halfway through an install, naming the figures.
need_disk() {
  local free_gb
  free_gb=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
  if [ "$free_gb" -lt "$1" ]; then
    echo "$2 needs about $1 GB of free disk; $free_gb GB are free on $(df -P . | awk 'NR == 2 { print $6 }')" >&2
    exit 1
  fi
}
