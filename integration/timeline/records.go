package timeline

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Records are what the bench kept, read file by file in the order the bench
// names them: the first time an event is seen is its time. Times are
// seconds of the guest's day (UTC), the one clock every record shares.
type Records struct {
	at       map[string]float64 // "pvc|pod|pv|lv NAME EVENT"
	pvOf     map[string]string  // claim -> its PV
	req      map[string]string  // claim -> its first request
	newReq   map[string]string  // claim -> its raised request
	pvCap    map[string]string  // PV -> its first capacity
	lvSize   map[string]string  // TopoLVM's LogicalVolume (named by its PV) -> its first size
	lvNew    map[string]string  // and its raised size
	vidOf    map[string]string  // PV -> TopoLVM's volume ID
	lvmdMade map[string]float64 // volume ID -> TopoLVM's lvmd made its LV
	lvmdGone map[string]float64 // volume ID -> and removed it
}

// NewRecords returns empty records.
func NewRecords() *Records {
	return &Records{at: map[string]float64{}, pvOf: map[string]string{}, req: map[string]string{},
		newReq: map[string]string{}, pvCap: map[string]string{}, lvSize: map[string]string{},
		lvNew: map[string]string{}, vidOf: map[string]string{}, lvmdMade: map[string]float64{},
		lvmdGone: map[string]float64{}}
}

// What a file holds is told by its name, as peers.sh names them.
var (
	watchFile   = regexp.MustCompile(`watch\.log$`)
	goneFile    = regexp.MustCompile(`gone\.log$`)
	grownFile   = regexp.MustCompile(`grown\.log$`)
	agentFile   = regexp.MustCompile(`(lvm-agent\.[^/]*\.lvm-agent\.log|live\.lvm-agent\.txt)$`) // the whole log, or the one followed live
	lvmdFile    = regexp.MustCompile(`topolvm\.[^/]*\.lvmd\.log$`)
	kubeletFile = regexp.MustCompile(`kubelet\.log$`)

	kubeletMounted = regexp.MustCompile(`MountVolume\.(MountDevice|SetUp) succeeded`)
	kubeletPod     = regexp.MustCompile(`pod="default/([^"]+)"`)
	lvmdName       = regexp.MustCompile(`"name":"([^"]*)"`)
	oneAtATime     = regexp.MustCompile(`-r[0-9]+-[0-9]+$`)
	grown          = regexp.MustCompile(`-r[0-9]+-g[0-9]+$`)
)

// ReadFile reads one of the bench's files; a file the timeline does not
// read (by its name) is skipped.
func (r *Records) ReadFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return r.Read(path, f)
}

// Read reads the lines of the file named name.
func (r *Records) Read(name string, in io.Reader) error {
	var line func(string)
	switch {
	case watchFile.MatchString(name):
		line = r.watchLine
	case goneFile.MatchString(name):
		line = func(l string) {
			if f := strings.Fields(l); len(f) >= 3 {
				r.first("pvc "+f[2]+" gone", dayOf(f[0]))
			}
		}
	case grownFile.MatchString(name):
		line = func(l string) {
			if f := strings.Fields(l); len(f) >= 2 {
				r.first("pvc "+f[1]+" grown", rfc(f[0]))
			}
		}
	case agentFile.MatchString(name):
		line = r.agentLine
	case lvmdFile.MatchString(name):
		line = r.lvmdLine
	case kubeletFile.MatchString(name):
		line = r.kubeletLine
	default:
		return nil
	}
	b := bufio.NewReader(in)
	for {
		l, err := b.ReadString('\n')
		if l != "" {
			line(strings.TrimRight(l, "\r\n"))
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
}

func (r *Records) first(key string, t float64) {
	if _, ok := r.at[key]; !ok {
		r.at[key] = t
	}
}

// watchLine: "EPOCH KIND NAME k=v ...", the bench's watches of claims,
// Pods, PVs and TopoLVM's LogicalVolumes (lv, named by its PV).
func (r *Records) watchLine(l string) {
	f := strings.Fields(l)
	if len(f) < 3 {
		return
	}
	t, kind, n := dayOf(f[0]), f[1], f[2]
	tok := func(name string) string { return tok(l, name) }
	switch kind {
	case "pvc":
		k := "pvc " + n + " "
		r.first(k+"seen", t)
		if tok("node") != "" {
			r.first(k+"selected", t)
		}
		switch tok("state") {
		case "creating":
			r.first(k+"request", t)
		case "created":
			r.first(k+"answer", t)
		}
		if tok("phase") == "Bound" {
			r.first(k+"bound", t)
		}
		if pv := tok("pv"); pv != "" {
			r.pvOf[n] = pv
		}
		if tok("del") != "" {
			r.first(k+"deleted", t)
		}
		q := tok("req")
		if first, ok := r.req[n]; !ok {
			r.req[n] = q
		} else if q != first {
			r.first(k+"raised", t)
			r.newReq[n] = q
		}
		if raised, ok := r.newReq[n]; ok {
			if tok("alloc") == raised {
				r.first(k+"alloc", t)
			}
			if tok("rs") == "NodeResizePending" {
				r.first(k+"nodepending", t)
			}
			if tok("cap") == raised {
				r.first(k+"capdone", t)
			}
		}
	case "pod":
		k := "pod " + n + " "
		if tok("node") != "" {
			r.first(k+"node", t)
		}
		if tok("phase") == "Running" {
			r.first(k+"running", t)
		}
		if tok("nudge") != "" {
			r.first(k+"nudged", t)
		}
	case "pv":
		k := "pv " + n + " "
		r.first(k+"made", t)
		if tok("phase") == "Released" {
			r.first(k+"released", t)
		}
		switch tok("state") {
		case "deleting":
			r.first(k+"request", t)
		case "deleted":
			r.first(k+"answer", t)
		case "expanding":
			r.first(k+"growrequest", t)
		case "expanded":
			r.first(k+"growanswer", t)
		}
		if tok("del") != "" {
			r.first(k+"deleted", t)
		}
		c := tok("cap")
		if first, ok := r.pvCap[n]; !ok {
			r.pvCap[n] = c
		} else if c != first {
			r.first(k+"cap", t)
		}
	case "lv":
		k := "lv " + n + " "
		r.first(k+"made", t)
		if vid := tok("vid"); vid != "" {
			r.first(k+"vid", t)
			r.vidOf[n] = vid
		}
		if tok("del") != "" {
			r.first(k+"deleted", t)
		}
		size := tok("size")
		if first, ok := r.lvSize[n]; !ok {
			r.lvSize[n] = size
		} else if size != first {
			r.first(k+"sizeraised", t)
			r.lvNew[n] = size
		}
		if raised, ok := r.lvNew[n]; ok && tok("cur") == raised {
			r.first(k+"curraised", t)
		}
	}
}

// agentLine: lvm-agent's agent, each answer's done line with its steps
// (containerd's stamp first, then klog's line).
func (r *Records) agentLine(l string) {
	if !strings.Contains(l, `"Volume request done"`) {
		return
	}
	f := strings.Fields(l)
	t := rfc(f[0])
	req, state := quoted(l, "request"), quoted(l, "state")
	d := func(name string) float64 { return goDuration(quoted(l, name)) }
	start := t - d("duration")
	var k string
	if claim, ok := strings.CutPrefix(req, "pvc:"); ok {
		_, name, _ := strings.Cut(claim, "/")
		k = "pvc " + name + " "
	} else {
		k = "pv " + strings.TrimPrefix(req, "pv:") + " "
	}
	var pre, call float64 // before lvmd's call; the call
	switch state {
	case "created":
		pre, call = d("lvmdList")+d("checks")+d("claimCheck"), d("lvmdCreate")
	case "deleted":
		pre, call = d("read")+d("checks")+d("claimCheck"), d("lvmdRemove")
	case "expanded":
		k += "grow"
		pre, call = d("read"), d("lvmdResize")
	default:
		return
	}
	r.first(k+"agentsaw", start-d("queued"))
	r.first(k+"agentstart", start)
	if call > 0 {
		r.first(k+"lvmdstart", start+pre)
		r.first(k+"lvmdend", start+pre+call)
	}
}

// lvmdLine: TopoLVM's lvmd, the LV (named by its volume ID) made and removed.
func (r *Records) lvmdLine(l string) {
	made := strings.Contains(l, `"created a new LV"`)
	if !made && !strings.Contains(l, `"removed a LV"`) {
		return
	}
	m := lvmdName.FindStringSubmatch(l)
	if m == nil {
		return
	}
	t := rfc(strings.Fields(l)[0])
	if made {
		r.lvmdMade[m[1]] = t
	} else {
		r.lvmdGone[m[1]] = t
	}
}

// kubeletLine: kubelet's first MountDevice or SetUp of a Pod's volume.
func (r *Records) kubeletLine(l string) {
	if !kubeletMounted.MatchString(l) {
		return
	}
	m := kubeletPod.FindStringSubmatch(l)
	f := strings.Fields(l)
	if m == nil || len(f) < 2 {
		return
	}
	r.first("pod "+m[1]+" mounted", clockSeconds(f[1]))
}

// event is the time of claim n's event ("pvc|pod|pv|lv|vid EVENT"), false
// when it was not seen.
func (r *Records) event(n, event string) (float64, bool) {
	obj, e, _ := strings.Cut(event, " ")
	if obj == "pvc" || obj == "pod" {
		t, ok := r.at[obj+" "+n+" "+e]
		return t, ok
	}
	pv, ok := r.pvOf[n]
	if !ok || pv == "" {
		return 0, false
	}
	switch obj {
	case "pv", "lv":
		t, ok := r.at[obj+" "+pv+" "+e]
		return t, ok
	case "vid":
		vid, ok := r.vidOf[pv]
		if !ok {
			return 0, false
		}
		var t float64
		switch e {
		case "made":
			t, ok = r.lvmdMade[vid]
		case "gone":
			t, ok = r.lvmdGone[vid]
		default:
			return 0, false
		}
		return t, ok
	}
	return 0, false
}

// Result is each hop's median over the bench's claims: STACK-rR-I one at a
// time (create, then delete), STACK-rR-gG grown.
func (r *Records) Result() *Result {
	var claims []string
	for k := range r.at {
		if n, ok := strings.CutPrefix(k, "pvc "); ok {
			if n, ok := strings.CutSuffix(n, " seen"); ok && !strings.Contains(n, " ") {
				claims = append(claims, n)
			}
		}
	}
	slices.Sort(claims)
	byOp := map[string]Op{}
	for _, op := range Ops {
		byOp[op.Name] = op
	}
	vals := map[string][][2][]float64{}
	for _, op := range Ops {
		vals[op.Name] = make([][2][]float64, len(op.Hops))
	}
	var shares []float64
	for _, n := range claims {
		s, ok := stackOf(n)
		if !ok {
			continue
		}
		var ops []string
		switch {
		case oneAtATime.MatchString(n):
			ops = []string{"create", "delete"}
		case grown.MatchString(n):
			ops = []string{"grow"}
		}
		for _, name := range ops {
			op := byOp[name]
			t0, ok := r.event(n, op.start)
			if !ok {
				continue
			}
			for i, h := range op.Hops {
				if h.event[s] == "" {
					continue
				}
				if t, ok := r.event(n, h.event[s]); ok {
					vals[name][i][s] = append(vals[name][i][s], t-t0)
				}
			}
			if name == "create" && s == LVMAgent {
				if x, ok := r.share(n, t0); ok {
					shares = append(shares, x)
				}
			}
		}
	}
	res := newResult()
	for name, hops := range vals {
		for i := range hops {
			for _, s := range Stacks {
				if xs := hops[i][s]; len(xs) > 0 {
					res.Medians[name][i][s] = &Median{Seconds: median(xs), Claims: len(xs)}
				}
			}
		}
	}
	if len(shares) > 0 {
		res.Share = &Share{Claims: len(shares), Median: median(shares)}
	}
	return res
}

func stackOf(claim string) (Stack, bool) {
	for _, s := range Stacks {
		if strings.HasPrefix(claim, s.claimPrefix()) {
			return s, true
		}
	}
	return 0, false
}

// share is lvm-agent's own hops of claim n's PVC -> Bound over the whole
// (Share), false unless the claim showed each hop it needs.
func (r *Records) share(n string, t0 float64) (float64, bool) {
	var t [7]float64
	for i, e := range []string{"pvc selected", "pvc request", "pvc lvmdstart", "pvc lvmdend", "pvc answer", "pv made", "pvc bound"} {
		var ok bool
		if t[i], ok = r.event(n, e); !ok {
			return 0, false
		}
	}
	sel, req, ls, le, ans, pv, bound := t[0], t[1], t[2], t[3], t[4], t[5], t[6]
	if bound <= t0 {
		return 0, false
	}
	return ((req - sel) + (ls - req) + (ans - le) + (pv - ans)) / (bound - t0), true
}

// tok is the value of " name=VALUE" in a watch line ("" when it has none).
func tok(l, name string) string {
	i := strings.Index(l, " "+name+"=")
	if i < 0 {
		return ""
	}
	v := l[i+len(name)+2:]
	if j := strings.IndexByte(v, ' '); j >= 0 {
		v = v[:j]
	}
	return v
}

// quoted is the value of name="VALUE" in a klog line.
func quoted(l, name string) string {
	i := strings.Index(l, name+`="`)
	if i < 0 {
		return ""
	}
	v, _, ok := strings.Cut(l[i+len(name)+2:], `"`)
	if !ok {
		return ""
	}
	return v
}

// number is the number s starts with, as awk reads one (0 when none): the
// records' times are written by different tools, some with a suffix.
var numberPrefix = regexp.MustCompile(`^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?`)

func number(s string) float64 {
	x, _ := strconv.ParseFloat(numberPrefix.FindString(strings.TrimSpace(s)), 64)
	return x
}

// dayOf: a Unix time (the watches' stamp) as seconds of its day.
func dayOf(epoch string) float64 { return math.Mod(number(epoch), 86400) }

// rfc: an RFC 3339 stamp (containerd's, the Pod's) as seconds of its day.
func rfc(s string) float64 {
	s = strings.TrimSuffix(s, "Z")
	if _, clock, ok := strings.Cut(s, "T"); ok {
		s = clock
	}
	return clockSeconds(s)
}

// clockSeconds: "hh:mm:ss.fraction" as seconds of the day (klog's clock,
// the second field of its line, is one).
func clockSeconds(s string) float64 {
	p := strings.SplitN(s, ":", 3)
	for len(p) < 3 {
		p = append(p, "")
	}
	return number(p[0])*3600 + number(p[1])*60 + number(p[2])
}

// goDuration: a Go duration as klog prints one (1.5s, 850.2ms, 900µs), in
// seconds; 0 when there is none.
func goDuration(s string) float64 {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0
	}
	return d.Seconds()
}
