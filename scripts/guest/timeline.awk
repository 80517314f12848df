# timeline.awk: make bench-peers' timeline of every hop, for each stack,
# from what the bench kept (scripts/guest/peers.sh): the watch lines (w),
# the LVs gone, the Pods' "grown" lines, the components' logs (stamped by
# containerd) and kubelet's. It prints, for create, delete and grow, the
# median time of each hop since the operation began (one claim at a time,
# every round), and writes the same as an SVG (-v svg=FILE): one bar per
# hop, lvm-agent's above TopoLVM's.
#
#   awk -f timeline.awk -v svg=FILE -v title=TEXT watch.log gone.log grown.log logs/*
#
# (logs/: each container's whole log, taken at the end, and the agent's
# followed as it ran, live.lvm-agent.txt: either serves.)
#
# Hops (all on the guest's clock; a hop a stack does not have is left out):
#   create  from w PVC seen: node selected (w the scheduler's annotation);
#           the request (w lvm-agent's "creating"; w TopoLVM's LogicalVolume
#           made by its CreateVolume); the agent saw it, started, lvmd's
#           CreateLV called and returned (the agent's done line and its
#           steps); lvmd's LV made (TopoLVM: its lvmd's "created a new LV");
#           the answer (w "created"; w the LogicalVolume's volumeID); w PV
#           made; w claim Bound; w Pod bound to the node; kubelet's first
#           MountDevice or SetUp of the volume (its log); w Pod Running
#   delete  from w PVC and Pod marked deleted: w PV Released; the request (w
#           "deleting"; w the LogicalVolume marked deleted); the agent and
#           lvmd's RemoveLV as above (TopoLVM: its lvmd's "removed a LV");
#           the answer (w "deleted"); w PV marked deleted; the LV's device gone
#   grow    from w the claim's request raised: w the resizer's allocated size;
#           the request (w "expanding"; w the LogicalVolume's size raised);
#           the agent and lvmd's ResizeLV; the answer (w "expanded"; w the
#           LogicalVolume's current size raised); w PV capacity raised;
#           w NodeResizePending; w the Pod nudged (either stack's annotation);
#           w the claim's capacity (kubelet's resize done); the Pod's "grown"
#
# Portable awk (the guest's busybox awk): no gawk extensions.

function day(e) { return e % 86400 }
function rfc(s,   p) { sub(/Z$/, "", s); split(substr(s, index(s, "T") + 1), p, ":"); return p[1] * 3600 + p[2] * 60 + p[3] }
function klog(s) { return substr(s, 7, 2) * 3600 + substr(s, 10, 2) * 60 + substr(s, 13) }
function dur(s,   p) { # a Go duration: 1.5s, 850.2ms, 900µs, 1m2.5s
  if (s ~ /ms$/) return substr(s, 1, length(s) - 2) / 1000
  if (s ~ /(µs|us)$/) { sub(/(µs|us)$/, "", s); return s / 1e6 }
  if (s ~ /ns$/) return substr(s, 1, length(s) - 2) / 1e9
  if (s ~ /m/) { split(s, p, "m"); return p[1] * 60 + substr(p[2], 1, length(p[2]) - 1) }
  return substr(s, 1, length(s) - 1)
}
function tok(name) { # the value of " name=VALUE" in this line
  if (!match($0, " " name "=[^ ]*")) return ""
  return substr($0, RSTART + length(name) + 2, RLENGTH - length(name) - 2)
}
function qv(name) { # the value of name="VALUE" in a klog line
  if (!match($0, name "=\"[^\"]*\"")) return ""
  return substr($0, RSTART + length(name) + 2, RLENGTH - length(name) - 3)
}
function first(k, t) { if (!(k in T)) T[k] = t }
function has(k) { return k in T }

FILENAME ~ /watch\.log$/ {
  t = day($1); n = $3
  if ($2 == "pvc") {
    first("pvc " n " seen", t)
    if (tok("node") != "") first("pvc " n " selected", t)
    if (tok("state") == "creating") first("pvc " n " request", t)
    if (tok("state") == "created") first("pvc " n " answer", t)
    if (tok("phase") == "Bound") first("pvc " n " bound", t)
    if (tok("pv") != "") PVOF[n] = tok("pv")
    if (tok("del") != "") first("pvc " n " deleted", t)
    q = tok("req")
    if (!(n in REQ)) REQ[n] = q
    else if (q != REQ[n]) { first("pvc " n " raised", t); NEWREQ[n] = q }
    if ((n in NEWREQ) && tok("alloc") == NEWREQ[n]) first("pvc " n " alloc", t)
    if ((n in NEWREQ) && tok("rs") == "NodeResizePending") first("pvc " n " nodepending", t)
    if ((n in NEWREQ) && tok("cap") == NEWREQ[n]) first("pvc " n " capdone", t)
  } else if ($2 == "pod") {
    if (tok("node") != "") first("pod " n " node", t)
    if (tok("phase") == "Running") first("pod " n " running", t)
    if (tok("nudge") != "") first("pod " n " nudged", t)
  } else if ($2 == "pv") {
    if (tok("claim") != "") CLAIMOF[n] = tok("claim")
    first("pv " n " made", t)
    if (tok("phase") == "Released") first("pv " n " released", t)
    if (tok("state") == "deleting") first("pv " n " request", t)
    if (tok("state") == "deleted") first("pv " n " answer", t)
    if (tok("state") == "expanding") first("pv " n " growrequest", t)
    if (tok("state") == "expanded") first("pv " n " growanswer", t)
    if (tok("del") != "") first("pv " n " deleted", t)
    c = tok("cap")
    if (!(n in PVCAP)) PVCAP[n] = c
    else if (c != PVCAP[n]) first("pv " n " cap", t)
  } else if ($2 == "lv") {
    first("lv " n " made", t)
    if (tok("vid") != "") { first("lv " n " vid", t); VIDOF[n] = tok("vid") }
    if (tok("del") != "") first("lv " n " deleted", t)
    sz = tok("size"); cur = tok("cur")
    if (!(n in LVSIZE)) LVSIZE[n] = sz
    else if (sz != LVSIZE[n]) { first("lv " n " sizeraised", t); LVNEW[n] = sz }
    if ((n in LVNEW) && cur == LVNEW[n]) first("lv " n " curraised", t)
  }
  next
}
FILENAME ~ /gone\.log$/ { first("pvc " $3 " gone", day($1)); next }
FILENAME ~ /grown\.log$/ { first("pvc " $2 " grown", rfc($1)); next }
# lvm-agent's agent: each answer's done line, with its steps.
FILENAME ~ /(lvm-agent\.[^\/]*\.lvm-agent\.log|live\.lvm-agent\.txt)$/ && /"Volume request done"/ {
  t = rfc($1); r = qv("request"); st = qv("state"); d = dur(qv("duration")); start = t - d
  if (r ~ /^pvc:/) { n = substr(r, index(r, "/") + 1); k = "pvc " n } else { n = substr(r, 4); k = "pv " n }
  if (st == "created") { op = ""; pre = dur(qv("lvmdList")) + dur(qv("checks")) + dur(qv("claimCheck")); call = dur(qv("lvmdCreate")) }
  else if (st == "deleted") { op = ""; pre = dur(qv("read")) + dur(qv("checks")) + dur(qv("claimCheck")); call = dur(qv("lvmdRemove")) }
  else if (st == "expanded") { op = "grow"; pre = dur(qv("read")); call = dur(qv("lvmdResize")) }
  else next
  first(k " " op "agentsaw", start - dur(qv("queued"))); first(k " " op "agentstart", start)
  if (call > 0) { first(k " " op "lvmdstart", start + pre); first(k " " op "lvmdend", start + pre + call) }
  next
}
# TopoLVM's lvmd: the LV (named by its volume ID) made and removed.
FILENAME ~ /topolvm\.[^\/]*\.lvmd\.log$/ && /"created a new LV"|"removed a LV"/ {
  if (!match($0, /"name":"[^"]*"/)) next
  v = substr($0, RSTART + 8, RLENGTH - 9)
  if (/"created a new LV"/) LVMDMADE[v] = rfc($1); else LVMDGONE[v] = rfc($1)
  next
}
FILENAME ~ /kubelet\.log$/ && /MountVolume\.(MountDevice|SetUp) succeeded/ {
  if (match($0, /pod="default\/[^"]+"/)) first("pod " substr($0, RSTART + 13, RLENGTH - 14) " mounted", klog($1 " " $2))
  next
}

# hop OP LABEL KEY_LVM_AGENT KEY_TOPOLVM: a row of OP's timeline ("-": the
# stack has no such hop). Keys: "pvc|pod|pv|lv|vid EVENT", resolved per claim.
function hop(op, label, a, b) { NH[op]++; HL[op, NH[op]] = label; HK[op, NH[op], 1] = a; HK[op, NH[op], 2] = b }
function at(n, key,   w, o, e, pv, v) { # the time of key's event for claim n, or "" (unknown)
  if (key == "-") return ""
  split(key, w, " "); o = w[1]; e = w[2]; pv = PVOF[n]
  if (o == "pvc" || o == "pod") return ((o " " n " " e) in T) ? T[o " " n " " e] : ""
  if (pv == "") return ""
  if (o == "pv") return ((o " " pv " " e) in T) ? T[o " " pv " " e] : ""
  if (o == "lv") return (("lv " pv " " e) in T) ? T["lv " pv " " e] : ""
  if (o == "vid" && (pv in VIDOF)) { v = VIDOF[pv]; if (e == "made" && (v in LVMDMADE)) return LVMDMADE[v]; if (e == "gone" && (v in LVMDGONE)) return LVMDGONE[v] }
  return ""
}
function median(op, s, i,   n, j, k, x, a) {
  n = CNT[op, s, i]; if (n == 0) return ""
  for (j = 1; j <= n; j++) a[j] = VAL[op, s, i, j]
  for (j = 2; j <= n; j++) { x = a[j]; for (k = j - 1; k >= 1 && a[k] > x; k--) a[k + 1] = a[k]; a[k + 1] = x }
  return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function fmt(x) { return x == "" ? "n/a" : sprintf("%.2f", x) }
function esc(s) { gsub(/&/, "\\&amp;", s); gsub(/</, "\\&lt;", s); gsub(/>/, "\\&gt;", s); return s }

END {
  S[1] = "lvm-agent"; S[2] = "topolvm"; NAMES[1] = "lvm-agent"; NAMES[2] = "TopoLVM"
  OPS = "create delete grow"
  T0["create"] = "pvc seen"; T0["delete"] = "pvc deleted"; T0["grow"] = "pvc raised"
  TITLE["create"] = "Create: PVC seen -> Pod Running"
  TITLE["delete"] = "Delete: PVC and Pod deleted -> LV gone"
  TITLE["grow"] = "Grow: request raised -> new size seen in the Pod"
  hop("create", "node selected (scheduler)", "pvc selected", "pvc selected")
  hop("create", "request (creating / LogicalVolume made)", "pvc request", "lv made")
  hop("create", "agent saw the request", "pvc agentsaw", "-")
  hop("create", "agent started", "pvc agentstart", "-")
  hop("create", "lvmd CreateLV called", "pvc lvmdstart", "-")
  hop("create", "lvmd CreateLV returned / LV made", "pvc lvmdend", "vid made")
  hop("create", "answer (created / volumeID)", "pvc answer", "lv vid")
  hop("create", "PV made", "pv made", "pv made")
  hop("create", "claim Bound", "pvc bound", "pvc bound")
  hop("create", "Pod bound to the node", "pod node", "pod node")
  hop("create", "volume set up (kubelet)", "pod mounted", "pod mounted")
  hop("create", "Pod Running", "pod running", "pod running")
  hop("delete", "PV Released", "pv released", "pv released")
  hop("delete", "request (deleting / LogicalVolume deleted)", "pv request", "lv deleted")
  hop("delete", "agent saw the request", "pv agentsaw", "-")
  hop("delete", "agent started", "pv agentstart", "-")
  hop("delete", "lvmd RemoveLV called", "pv lvmdstart", "-")
  hop("delete", "lvmd RemoveLV returned / LV removed", "pv lvmdend", "vid gone")
  hop("delete", "answer (deleted)", "pv answer", "-")
  hop("delete", "PV deleted", "pv deleted", "pv deleted")
  hop("delete", "LV's device gone", "pvc gone", "pvc gone")
  hop("grow", "resizer took it (allocatedResources)", "pvc alloc", "pvc alloc")
  hop("grow", "request (expanding / LogicalVolume size)", "pv growrequest", "lv sizeraised")
  hop("grow", "agent saw the request", "pv growagentsaw", "-")
  hop("grow", "agent started", "pv growagentstart", "-")
  hop("grow", "lvmd ResizeLV called", "pv growlvmdstart", "-")
  hop("grow", "lvmd ResizeLV returned", "pv growlvmdend", "-")
  hop("grow", "answer (expanded / currentSize)", "pv growanswer", "lv curraised")
  hop("grow", "PV capacity raised", "pv cap", "pv cap")
  hop("grow", "NodeResizePending", "pvc nodepending", "pvc nodepending")
  hop("grow", "Pod nudged", "pod nudged", "pod nudged")
  hop("grow", "claim capacity (kubelet's resize)", "pvc capdone", "pvc capdone")
  hop("grow", "new size seen in the Pod", "pvc grown", "pvc grown")

  # Each claim of the bench: S-rR-I one at a time (create, delete), S-rR-gG grown.
  for (k in T) { split(k, w, " "); if (w[1] != "pvc" || w[3] != "seen") continue
    n = w[2]; s = (n ~ /^lvm-agent-/) ? 1 : (n ~ /^topolvm-/) ? 2 : 0
    if (!s) continue
    if (n ~ /-r[0-9]+-[0-9]+$/) { ops[1] = "create"; ops[2] = "delete"; m = 2 }
    else if (n ~ /-r[0-9]+-g[0-9]+$/) { ops[1] = "grow"; m = 1 }
    else continue
    for (j = 1; j <= m; j++) { op = ops[j]; t0 = at(n, T0[op]); if (t0 == "") continue
      for (i = 1; i <= NH[op]; i++) { x = at(n, HK[op, i, s]); if (x == "") continue
        CNT[op, S[s], i]++; VAL[op, S[s], i, CNT[op, S[s], i]] = x - t0 }
      if (op == "create" && s == 1) share(n, t0) } }

  nops = split(OPS, O, " ")
  for (o = 1; o <= nops; o++) { op = O[o]
    printf "\n%s: median seconds since the start (claims)\n", TITLE[op]
    printf "  %-44s %12s %12s\n", "hop", "lvm-agent", "TopoLVM"
    for (i = 1; i <= NH[op]; i++) { a = median(op, S[1], i); b = median(op, S[2], i); M[op, 1, i] = a; M[op, 2, i] = b
      if (a == "" && b == "") continue
      printf "  %-44s %8s (%2d) %8s (%2d)\n", HL[op, i], fmt(a), CNT[op, S[1], i], fmt(b), CNT[op, S[2], i] } }
  if (NSHARE) { med = sharemedian()
    printf "\nlvm-agent's own share of PVC -> Bound (the provisioner's and the agent's hops; not lvmd's call,\n"
    printf "the scheduler, the PV controller or kubelet), median of %d: %.1f%%  goal <= 20%%: %s\n", NSHARE, 100 * med, (med <= 0.2 ? "met" : "MISSED") }
  if (svg != "") draw()
}

# share N T0: lvm-agent's own hops of claim N's PVC -> Bound: the
# provisioner's (selected -> request; answer -> PV made) and the agent's
# (request -> lvmd called; lvmd returned -> answer), over the whole.
function share(n, t0,   sel, req, ls, le, ans, pv, b) {
  sel = at(n, "pvc selected"); req = at(n, "pvc request"); ls = at(n, "pvc lvmdstart"); le = at(n, "pvc lvmdend")
  ans = at(n, "pvc answer"); pv = at(n, "pv made"); b = at(n, "pvc bound")
  if (sel == "" || req == "" || ls == "" || le == "" || ans == "" || pv == "" || b == "" || b <= t0) return
  NSHARE++; SHARE[NSHARE] = ((req - sel) + (ls - req) + (ans - le) + (pv - ans)) / (b - t0)
}
function sharemedian(   j, k, x, a) {
  for (j = 1; j <= NSHARE; j++) a[j] = SHARE[j]
  for (j = 2; j <= NSHARE; j++) { x = a[j]; for (k = j - 1; k >= 1 && a[k] > x; k--) a[k + 1] = a[k]; a[k + 1] = x }
  return (NSHARE % 2) ? a[(NSHARE + 1) / 2] : (a[NSHARE / 2] + a[NSHARE / 2 + 1]) / 2
}

# draw: the SVG. Per operation, a row per hop; in each row lvm-agent's bar
# (blue) above TopoLVM's (orange), from the stack's hop before to this one
# (the medians since the start), its end written beside it.
function draw(   W, L, R, y, o, op, i, s, max, px, prev, x, x0, w, col, rows, h) {
  W = 980; L = 300; R = 90; h = 0
  for (o = 1; o <= nops; o++) { op = O[o]; rows = 0; for (i = 1; i <= NH[op]; i++) if (M[op, 1, i] != "" || M[op, 2, i] != "") rows++; h += 60 + rows * 26 }
  printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, h + 50 > svg
  printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n" > svg
  printf "<text x=\"10\" y=\"20\" font-size=\"15\" font-weight=\"bold\">%s</text>\n", esc(title) > svg
  printf "<rect x=\"%d\" y=\"30\" width=\"12\" height=\"8\" fill=\"#1f77b4\"/><text x=\"%d\" y=\"38\">lvm-agent</text>\n", L, L + 16 > svg
  printf "<rect x=\"%d\" y=\"30\" width=\"12\" height=\"8\" fill=\"#ff7f0e\"/><text x=\"%d\" y=\"38\">TopoLVM</text>\n", L + 100, L + 116 > svg
  printf "<text x=\"%d\" y=\"38\" fill=\"#555\">bar: from the hop before to this one; medians, seconds since the start</text>\n", L + 200 > svg
  y = 60
  for (o = 1; o <= nops; o++) { op = O[o]; max = 0
    for (i = 1; i <= NH[op]; i++) for (s = 1; s <= 2; s++) if (M[op, s, i] != "" && M[op, s, i] > max) max = M[op, s, i]
    if (max <= 0) max = 1
    px = (W - L - R) / max
    printf "<text x=\"10\" y=\"%d\" font-size=\"13\" font-weight=\"bold\">%s</text>\n", y + 14, esc(TITLE[op]) > svg
    printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#ccc\"/>\n", L, y + 20, L, y + 20 + 26 * NH[op] > svg
    y += 24
    for (s = 1; s <= 2; s++) PREV[s] = 0
    for (i = 1; i <= NH[op]; i++) { if (M[op, 1, i] == "" && M[op, 2, i] == "") continue
      printf "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", L - 8, y + 15, esc(HL[op, i]) > svg
      for (s = 1; s <= 2; s++) { x = M[op, s, i]; if (x == "") continue
        prev = PREV[s]; if (x < prev) prev = x
        x0 = L + prev * px; w = (x - prev) * px; if (w < 2) w = 2
        col = (s == 1) ? "#1f77b4" : "#ff7f0e"
        printf "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"10\" fill=\"%s\"><title>%s %s: %.2f s</title></rect>\n", x0, y + 2 + (s - 1) * 11, w, col, NAMES[s], esc(HL[op, i]), x > svg
        printf "<text x=\"%.1f\" y=\"%d\" font-size=\"10\" fill=\"#333\">%.2f</text>\n", x0 + w + 4, y + 11 + (s - 1) * 11, x > svg
        PREV[s] = x }
      y += 26 }
    y += 16 }
  printf "</svg>\n" > svg
  close(svg)
}
