# Sourced by the setup scripts.

# This machine's pip.conf is chatty.
quiet() { "$@" 2>&1 | { grep -v -e "^WARNING: Location" -e "^ *$" || true; }; }

# need_disk GB WHAT: stops before pip fills the disk halfway through an install, naming the figures.
need_disk() {
  local free_gb
  free_gb=$(df -Pk . | awk 'NR == 2 { print int($4 / 1048576) }')
  if [ "$free_gb" -lt "$1" ]; then
    echo "$2 needs about $1 GB of free disk; $free_gb GB are free on $(df -P . | awk 'NR == 2 { print $6 }')" >&2
    exit 1
  fi
}
