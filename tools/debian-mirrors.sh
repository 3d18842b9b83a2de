# Shared by tools/pod-runtime.sh and tools/nspawn-root.sh (sourced): the machine's own Debian mirrors,
# read from sources.list (one-line) and sources.list.d (*.list, *.sources deb822): the main archive's URI
# (suites like bookworm, bookworm-updates) and the security archive's (bookworm-security), reused for
# $SUITE. Third-party repositories (other suites, URIs without /debian) are left out.
debian_mirrors() {
  local files=() etc=${DEPLOYKIT_APT_ETC:-/etc/apt}
  [ -f "$etc/sources.list" ] && files+=("$etc/sources.list")
  for f in "$etc"/sources.list.d/*.list "$etc"/sources.list.d/*.sources; do
    [ -f "$f" ] && files+=("$f")
  done
  [ ${#files[@]} -gt 0 ] || return 0
  awk '
    function emit(uris, suites,   nu, ns, u, s, i, j) {
      nu = split(uris, u, /[ \t]+/); ns = split(suites, s, /[ \t]+/)
      for (i = 1; i <= nu; i++) for (j = 1; j <= ns; j++) {
        if (u[i] == "" || s[j] == "") continue
        if (s[j] ~ /^[a-z]+-security$/ || s[j] ~ /^[a-z]+\/updates$/) { if (!sec) sec = u[i] }
        else if (s[j] ~ /^[a-z]+(-updates)?$/ && u[i] ~ /\/debian(\/|$)/) { if (!main) main = u[i] }
      }
    }
    function flush() { if (enabled && types ~ /(^|[ \t])deb([ \t]|$)/) emit(uris, suites); reset() }
    function reset() { types = ""; uris = ""; suites = ""; enabled = 1 }
    BEGIN { reset() }
    FNR == 1 { flush(); deb822 = (FILENAME ~ /\.sources$/) }
    /^[ \t]*#/ { next }
    !deb822 {
      line = $0; sub(/\[[^]]*\]/, "", line); n = split(line, w, /[ \t]+/)
      k = (w[1] == "") ? 2 : 1
      if (w[k] == "deb") emit(w[k + 1], w[k + 2])
      next
    }
    /^[ \t]*$/ { flush(); next }
    /^[ \t]/ { next }
    {
      key = tolower($0); sub(/:.*/, "", key); val = $0; sub(/^[^:]*:[ \t]*/, "", val)
      if (key == "types") types = val; else if (key == "uris") uris = val
      else if (key == "suites") suites = val; else if (key == "enabled") enabled = (tolower(val) != "no")
    }
    END {
      flush()
      if (main) { print "deb " main " '"$SUITE"' main"; print "deb " main " '"$SUITE"'-updates main" }
      if (sec) print "deb " sec " '"$SUITE"'-security main"
    }
  ' "${files[@]}"
}
