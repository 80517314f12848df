package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/yaml"

	"github.com/lvm-agent/lvm-agent/provisioner"
)

// The documentation's flag tables are checked against the binary's own
// --help: a table follows a marker naming the commands it documents,
//
//	<!-- flags: lvm-agent volume create, lvm-agent volume delete -->
//
// and each row names flags (`--x`, `-n`) and their default. Every flag a
// row names must exist in one of those commands, with that default; the
// tables of docs/operations.md (the reference) must also name every flag.
// The tables may stand in the README and in any file of docs/.
const flagReference = "../../docs/operations.md"

const runMainEnv = "LVM_AGENT_TEST_RUN_MAIN"

// TestMain lets the tests run this package's main as the real binary.
func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
	}
	os.Exit(m.Run())
}

// helpDefaults runs "lvm-agent ARGS --help" and returns each flag's default
// as --help prints it ("" when the flag's default is its zero value).
func helpDefaults(t *testing.T, args ...string) map[string]string {
	t.Helper()
	code, out, _ := runSelf(t, append(args, "--help")...)
	require.Equal(t, 0, code, "--help exits 0")
	return parseHelp(out)
}

var (
	helpFlag    = regexp.MustCompile(`^  --?(\S+)`)
	helpDefault = regexp.MustCompile(`\(default ("(?:[^"\\]|\\.)*"|[^\s()]+)\)$`)
)

// parseHelp reads the flag package's PrintDefaults format, with --name as
// printFlags writes it.
func parseHelp(help string) map[string]string {
	flags := map[string]string{}
	name := ""
	for _, l := range strings.Split(help, "\n") {
		if m := helpFlag.FindStringSubmatch(l); m != nil {
			name = m[1]
			flags[name] = ""
			l = strings.TrimPrefix(l, m[0])
		}
		if name == "" {
			continue
		}
		if m := helpDefault.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			v := m[1]
			if u, err := strconv.Unquote(v); err == nil {
				v = u
			}
			flags[name] = v
		}
	}
	return flags
}

// docRow is one row of a flag table.
type docRow struct {
	line     int
	flags    []string // without dashes
	defaults []string // one for all flags, or one per flag
}

// docTable is a flag table and the commands its marker names.
type docTable struct {
	cmds []string
	rows []docRow
}

// docTables returns the flag tables of a markdown file.
func docTables(text string) []docTable {
	marker := regexp.MustCompile(`^<!-- flags: (.+) -->$`)
	flagToken := regexp.MustCompile("`(--?[a-z][a-z0-9-]*)`")
	var tables []docTable
	var cur *docTable
	for i, l := range strings.Split(text, "\n") {
		if m := marker.FindStringSubmatch(l); m != nil {
			tables = append(tables, docTable{cmds: strings.Split(m[1], ", ")})
			cur = &tables[len(tables)-1]
			continue
		}
		if cur == nil {
			continue
		}
		if !strings.HasPrefix(l, "|") {
			if len(cur.rows) > 0 {
				cur = nil // the table ended
			}
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if len(cells) < 2 || !strings.Contains(cells[0], "`-") {
			continue // the header and separator rows
		}
		r := docRow{line: i + 1}
		for _, m := range flagToken.FindAllStringSubmatch(cells[0], -1) {
			r.flags = append(r.flags, strings.TrimLeft(m[1], "-"))
		}
		// "a, b" pairs with the row's flags, except where the default comes
		// from the environment ("`$NODE_NAME`, then `$KUBE_NODE_NAME`").
		if strings.Contains(cells[1], "`$") {
			r.defaults = []string{strings.TrimSpace(cells[1])}
		} else {
			for _, d := range strings.Split(cells[1], ", ") {
				r.defaults = append(r.defaults, strings.TrimSpace(d))
			}
		}
		cur.rows = append(cur.rows, r)
	}
	return tables
}

// zeroSpellings are how the docs say "no default": --help prints none.
var zeroSpellings = []string{"", "(none)", "none", "false", "0", "(off)", "off", "empty", "in-cluster", "(same name)", "text"}

// sameDefault: does the documented default doc say what --help's help does?
// A default documented as an environment variable ("`$NODE_NAME`, then …")
// comes from the environment and is not compared.
func sameDefault(doc, help string) bool {
	if strings.Contains(doc, "`$") {
		return true
	}
	doc = strings.TrimSpace(regexp.MustCompile(`\s*\(.*\)$`).ReplaceAllString(doc, ""))
	if doc == "" { // a cell that was only a parenthesis: "(none)"
		return help == ""
	}
	doc = strings.Trim(doc, "`")
	if doc == help {
		return true
	}
	if help == "" || help == "0s" {
		return slices.Contains(zeroSpellings, doc)
	}
	if a, err := time.ParseDuration(doc); err == nil {
		b, err := time.ParseDuration(help)
		return err == nil && a == b
	}
	if a, err := strconv.ParseFloat(doc, 64); err == nil {
		b, err := strconv.ParseFloat(help, 64)
		return err == nil && a == b
	}
	return false
}

// checkRows compares a command set's documented rows with --help.
func checkRows(file string, cmds map[string]map[string]string, rows []docRow) []string {
	var problems []string
	for _, r := range rows {
		if len(r.defaults) != 1 && len(r.defaults) != len(r.flags) {
			problems = append(problems, fmt.Sprintf("%s:%d: %d flags but %d defaults", file, r.line, len(r.flags), len(r.defaults)))
			continue
		}
		for i, f := range r.flags {
			doc := r.defaults[0]
			if len(r.defaults) > 1 {
				doc = r.defaults[i]
			}
			found := false
			for cmd, flags := range cmds {
				help, ok := flags[f]
				if !ok {
					continue
				}
				found = true
				if !sameDefault(doc, help) {
					problems = append(problems, fmt.Sprintf("%s:%d: --%s: documented default %q, but %s --help says %q", file, r.line, f, doc, cmd, help))
				}
			}
			if !found {
				problems = append(problems, fmt.Sprintf("%s:%d: --%s is documented but no command has it", file, r.line, f))
			}
		}
	}
	slices.Sort(problems)
	return problems
}

func TestDocumentedFlagsMatchHelp(t *testing.T) {
	commands := map[string][]string{
		"lvm-agent":               nil,
		"lvm-agent volume create": {"volume", "create"},
		"lvm-agent volume delete": {"volume", "delete"},
		"lvm-agent volume status": {"volume", "status"},
		"lvm-agent provisioner":   {"provisioner"},
	}
	help := map[string]map[string]string{}
	for name, args := range commands {
		help[name] = helpDefaults(t, args...)
		require.NotEmpty(t, help[name], name)
	}
	files, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	for _, file := range append(files, "../../README.md") {
		complete := file == flagReference
		text, err := os.ReadFile(file)
		require.NoError(t, err)
		tables := docTables(string(text))
		if complete {
			require.NotEmpty(t, tables, "%s has flag tables", file)
		}
		var problems []string
		byCmd := map[string][]docRow{}
		for _, tb := range tables {
			cmds := map[string]map[string]string{}
			for _, c := range tb.cmds {
				require.Contains(t, help, c, "%s: a marker names an unknown command", file)
				cmds[c] = help[c]
				byCmd[c] = append(byCmd[c], tb.rows...)
			}
			problems = append(problems, checkRows(file, cmds, tb.rows)...)
		}
		if complete {
			for c, flags := range help {
				if _, marked := byCmd[c]; !marked {
					continue // documented in full elsewhere
				}
				for f := range flags {
					if !slices.ContainsFunc(byCmd[c], func(r docRow) bool { return slices.Contains(r.flags, f) }) {
						problems = append(problems, fmt.Sprintf("%s: %s --%s is not documented", file, c, f))
					}
				}
			}
		}
		slices.Sort(problems)
		assert.Empty(t, problems, "%s disagrees with --help", file)
	}
}

// driftHelp is the flag package's PrintDefaults output for a few flags.
const driftHelp = `Usage of x:
  -workers int
    	requests handled in parallel (default 8)
  -sweep-interval duration
    	how often (default 30m0s)
  -backend string
    	dialect (default "topolvm")
  -node-name string
    	this node's name (default from $NODE_NAME, then $KUBE_NODE_NAME)
  -allow-untagged-delete
    	let deletes remove LVs
`

// The check fails when a documented default or flag drifts.
func TestDocsDriftIsCaught(t *testing.T) {
	help := parseHelp(driftHelp)
	assert.Equal(t, map[string]string{"workers": "8", "sweep-interval": "30m0s", "backend": "topolvm", "node-name": "", "allow-untagged-delete": ""}, help)
	assert.Equal(t, help, parseHelp(longFlag.ReplaceAllString(driftHelp, "  --$1")), "the help as printFlags prints it")
	cmds := map[string]map[string]string{"x": help}
	table := func(rows string) []docRow {
		return docTables("<!-- flags: x -->\n| flag | default |\n|---|---|\n" + rows)[0].rows
	}
	for _, tc := range []struct {
		name, rows string
		problems   int
	}{
		{"agrees", "| `--workers` | 8 |\n| `--sweep-interval` | 30m |\n| `--backend` | `topolvm` |\n| `--node-name` | `$NODE_NAME` |\n| `--allow-untagged-delete` | false |\n", 0},
		{"wrong number", "| `--workers` | 16 |\n", 1},
		{"wrong duration", "| `--sweep-interval` | 30s |\n", 1},
		{"wrong string", "| `--backend` | `google-lvmd` |\n", 1},
		{"zero documented as a value", "| `--allow-untagged-delete` | true |\n", 1},
		{"flag gone", "| `--no-such-flag` | 1 |\n", 1},
		{"pairs", "| `--workers`, `--sweep-interval` | 8, 30m |\n", 0},
		{"pairs, one wrong", "| `--workers`, `--sweep-interval` | 8, 1h |\n", 1},
		{"ambiguous row", "| `--workers`, `--sweep-interval`, `--backend` | 8, 30m |\n", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Len(t, checkRows("doc.md", cmds, table(tc.rows)), tc.problems)
		})
	}
}

// repoPath is a repository file named in prose: a top-level directory of
// the repository, then a path, then a file extension.
var repoPath = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])((?:deploy|charts|scripts|integration|docs|cmd|agent|kube|provisioner|lvmbackend)/[A-Za-z0-9_./+-]*[A-Za-z0-9_]\.(?:yaml|yml|md|sh|go|json|tpl|service|env))\b`)

// The markdown files and the deploy/ manifests name files that exist, the
// markdown files name make targets that exist, and the README names every
// benchmark target of the Makefile.
func TestDocsNameRealFiles(t *testing.T) {
	manifests, err := filepath.Glob("../../deploy/*/*.yaml")
	require.NoError(t, err)
	files := append(markdownFiles(t), manifests...)
	for _, f := range files {
		text, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range repoPath.FindAllStringSubmatch(string(text), -1) {
			_, err := os.Stat(filepath.Join("../..", m[1]))
			assert.NoError(t, err, "%s names %s", f, m[1])
		}
	}
	makefile, err := os.ReadFile("../../Makefile")
	require.NoError(t, err)
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	targets := regexp.MustCompile(`(?m)^(bench-[a-z-]+):`).FindAllStringSubmatch(string(makefile), -1)
	require.NotEmpty(t, targets)
	for _, m := range targets {
		assert.True(t, strings.Contains(string(readme), "make "+m[1]), "the README's list of benchmarks lacks make %s", m[1])
	}
	// Every make command a document names is a target of the Makefile.
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9 -]*):`).FindAllStringSubmatch(string(makefile), -1) {
		for _, name := range strings.Fields(m[1]) {
			defined[name] = true
		}
	}
	for _, f := range files {
		if !strings.HasSuffix(f, ".md") {
			continue
		}
		text, err := os.ReadFile(f)
		require.NoError(t, err)
		named := makeInCode.FindAllStringSubmatch(string(text), -1)
		for _, fence := range mdFence.FindAllString(string(text), -1) {
			named = append(named, makeInFence.FindAllStringSubmatch(fence, -1)...)
		}
		for _, m := range named {
			assert.True(t, defined[m[1]], "%s names make %s, which the Makefile does not define", f, m[1])
		}
	}
}

// A make command in a markdown text: in code (`make test`), or at the start
// of a line of a code block.
var (
	makeInCode  = regexp.MustCompile("`make ([a-z][a-z0-9-]*)")
	makeInFence = regexp.MustCompile(`(?m)^\s*make ([a-z][a-z0-9-]*)`)
)

const installDoc = "../../docs/install.md"

// docSection is the text of a markdown section, from its heading ("##
// The provisioner") to the next heading of the same level or higher.
func docSection(text, heading string) string {
	level := strings.Count(strings.Fields(heading)[0], "#")
	_, rest, ok := strings.Cut(text, "\n"+heading+"\n")
	if !ok {
		return ""
	}
	for _, l := range regexp.MustCompile(`(?m)^#{1,6} `).FindAllStringIndex(rest, -1) {
		if strings.Count(rest[l[0]:l[1]], "#") <= level {
			return rest[:l[0]]
		}
	}
	return rest
}

// docParameters reads the StorageClass parameters a sentence names:
// "parameters: `a` (required), `b` (default `x`), `c` and `d` (below); any
// other parameter is an error". The names are its code spans outside
// parentheses (those inside are values).
func docParameters(section string) ([]string, error) {
	_, rest, ok := strings.Cut(section, "parameters: ")
	if !ok {
		return nil, fmt.Errorf(`no "parameters: " sentence`)
	}
	sentence, _, ok := strings.Cut(rest, "any other parameter is an error")
	if !ok {
		return nil, fmt.Errorf(`the parameter sentence does not end "any other parameter is an error"`)
	}
	var outside strings.Builder
	depth := 0
	for _, r := range sentence {
		switch {
		case r == '(':
			depth++
		case r == ')':
			depth--
		case depth == 0:
			outside.WriteRune(r)
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("unbalanced parentheses in %q", sentence)
	}
	var names []string
	for _, m := range regexp.MustCompile("`([A-Za-z]+)`").FindAllStringSubmatch(outside.String(), -1) {
		names = append(names, m[1])
	}
	slices.Sort(names)
	return names, nil
}

// docs/install.md's StorageClass parameter sentence ("The provisioner")
// names every parameter the provisioner knows, and no other.
func TestInstallDocParameters(t *testing.T) {
	text, err := os.ReadFile(installDoc)
	require.NoError(t, err)
	section := docSection(string(text), "## The provisioner")
	require.NotEmpty(t, section, "docs/install.md has a section \"The provisioner\"")
	got, err := docParameters(section)
	require.NoError(t, err)
	want := provisioner.Parameters()
	slices.Sort(want)
	assert.Equal(t, want, got, "docs/install.md's parameters against provisioner.Parameters()")
}

// rbacWords: how docs/install.md names each resource of an RBAC rule.
var rbacWords = map[string]string{
	"persistentvolumeclaims": "PVCs", "persistentvolumeclaims/status": "PVCs' `status`", "persistentvolumes": "PVs",
	"pods": "Pods", "nodes": "Nodes", "events": "events", "storageclasses": "StorageClasses",
	"statefulsets": "StatefulSets", "leases": "Lease", "csistoragecapacities": "CSIStorageCapacities", "secrets": "Secrets",
}

// rbacProblems lists what a description of a manifest's RBAC leaves out:
// each resource of each Role and ClusterRole rule, by its rbacWords name,
// and each verb ("read-only" stands for get, list and watch).
func rbacProblems(manifest []byte, text string) ([]string, error) {
	var problems []string
	d := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		var obj struct {
			Kind  string
			Rules []rbacv1.PolicyRule
		}
		if err := d.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, err
		}
		if obj.Kind != "Role" && obj.Kind != "ClusterRole" {
			continue
		}
		for _, r := range obj.Rules {
			for _, res := range r.Resources {
				word, ok := rbacWords[res]
				if !ok {
					problems = append(problems, fmt.Sprintf("%s: no name for %s in rbacWords: add the one the doc uses", obj.Kind, res))
				} else if !strings.Contains(text, word) {
					problems = append(problems, fmt.Sprintf("%s: %s (%s) is not named", obj.Kind, word, res))
				}
			}
			for _, v := range r.Verbs {
				readOnly := !slices.ContainsFunc(r.Verbs, func(v string) bool { return v != "get" && v != "list" && v != "watch" }) &&
					strings.Contains(text, "read-only")
				if !readOnly && !regexp.MustCompile(`\b`+regexp.QuoteMeta(v)+`\b`).MatchString(text) {
					problems = append(problems, fmt.Sprintf("%s: verb %s of %v is not named", obj.Kind, v, r.Resources))
				}
			}
		}
	}
	return problems, nil
}

// docs/install.md's descriptions of the agent's and the provisioner's RBAC
// name every resource and verb their manifests grant.
func TestInstallDocRBAC(t *testing.T) {
	text, err := os.ReadFile(installDoc)
	require.NoError(t, err)
	for manifest, passage := range map[string][2]string{
		"../../deploy/base/rbac.yaml":             {"- The agent's API access", "\n- "},
		"../../deploy/base/provisioner-rbac.yaml": {"Its RBAC is\n`provisioner-rbac.yaml`", "\nIts startup"},
	} {
		_, rest, ok := strings.Cut(string(text), passage[0])
		require.True(t, ok, "docs/install.md has %q", passage[0])
		desc, _, ok := strings.Cut(rest, passage[1])
		require.True(t, ok, "docs/install.md: %q ends before %q", passage[0], passage[1])
		data, err := os.ReadFile(manifest)
		require.NoError(t, err)
		problems, err := rbacProblems(data, desc)
		require.NoError(t, err, manifest)
		assert.Empty(t, problems, "docs/install.md's description of %s", manifest)
	}
}

// Both checks fail when the doc drifts from the code.
func TestInstallDocDriftIsCaught(t *testing.T) {
	names, err := docParameters("parameters: `volumeGroup` (required), `fsType` (default `ext4`, or `xfs`), `wipe` and `encryption` (below); any other parameter is an error.")
	require.NoError(t, err)
	assert.Equal(t, []string{"encryption", "fsType", "volumeGroup", "wipe"}, names, "values in parentheses are not parameters")
	for _, bad := range []string{"parameters: `a` (b; any other parameter is an error", "`a`; any other parameter is an error", "parameters: `a`."} {
		_, err := docParameters(bad)
		assert.Error(t, err, bad)
	}
	rbac := []byte("kind: ClusterRole\nrules:\n  - resources: [nodes]\n    verbs: [get, patch]\n---\nkind: Role\nrules:\n  - resources: [secrets]\n    verbs: [get]\n")
	for text, n := range map[string]int{
		"Nodes get/patch, and Secrets get": 0,
		"Nodes get/patch":                  1, // a Role's resource left out
		"Nodes get, Secrets get":           1, // a verb left out
		"Nodes and Secrets read-only":      2, // get and patch are not read-only
		"nodes get/patch, Secrets get":     1, // not the doc's name
	} {
		problems, err := rbacProblems(rbac, text)
		require.NoError(t, err)
		assert.Len(t, problems, n, "%q: %v", text, problems)
	}
	problems, err := rbacProblems([]byte("kind: Role\nrules:\n  - resources: [configmaps]\n    verbs: [get]\n"), "ConfigMaps get")
	require.NoError(t, err)
	assert.Len(t, problems, 1, "a resource without a doc name is a problem, not a pass")
}
