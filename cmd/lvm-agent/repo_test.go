package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Checks of the repository itself (issue 17): what is tracked, where the
// documentation's links go, and the compatibility table against the pins.

const repoRoot = "../.."

// No build output is committed: no tracked file is an ELF executable or
// larger than 1 MiB. git is required (CI has it); without it this fails.
func TestNoBuildOutputsTracked(t *testing.T) {
	out, err := exec.Command("git", "-C", repoRoot, "ls-files", "-z").Output()
	require.NoError(t, err, "git ls-files (git is required)")
	files := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	require.NotEmpty(t, files)
	for _, f := range files {
		fi, err := os.Lstat(filepath.Join(repoRoot, f))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet committed
		}
		require.NoError(t, err)
		if !fi.Mode().IsRegular() {
			continue
		}
		assert.LessOrEqual(t, fi.Size(), int64(1<<20), "%s is larger than 1 MiB", f)
		head := make([]byte, 4)
		fh, err := os.Open(filepath.Join(repoRoot, f))
		require.NoError(t, err)
		n, _ := fh.Read(head)
		fh.Close()
		assert.False(t, bytes.Equal(head[:n], []byte("\x7fELF")), "%s is an ELF executable", f)
	}
}

var (
	mdFence   = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```")
	mdCode    = regexp.MustCompile("`[^`\n]*`")
	mdInline  = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	mdRefDefn = regexp.MustCompile(`(?m)^\s*\[[^\]]+\]:\s*(\S+)`)
)

// mdLinks are the link targets of a markdown text, outside code.
func mdLinks(text string) []string {
	text = mdCode.ReplaceAllString(mdFence.ReplaceAllString(text, ""), "")
	var links []string
	for _, re := range []*regexp.Regexp{mdInline, mdRefDefn} {
		for _, m := range re.FindAllStringSubmatch(text, -1) {
			links = append(links, m[1])
		}
	}
	return links
}

var mdHeading = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)

// mdAnchors are the anchors GitHub gives a markdown text's headings: lower
// case, only letters, digits, '_', '-' and spaces kept, spaces made '-', a
// repeated one suffixed -1, -2, ...
func mdAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, m := range mdHeading.FindAllStringSubmatch(mdFence.ReplaceAllString(text, ""), -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// markdownFiles are the repository's top-level, docs/ and docs/runs/
// markdown files.
func markdownFiles(t *testing.T) []string {
	var files []string
	for _, glob := range []string{"*.md", "docs/*.md", "docs/runs/*.md"} {
		m, err := filepath.Glob(filepath.Join(repoRoot, glob))
		require.NoError(t, err)
		files = append(files, m...)
	}
	require.NotEmpty(t, files)
	return files
}

// Every relative link of the top-level, docs/ and docs/runs/ markdown files
// names a file or directory of the repository, and its #anchor, if any, a
// heading of that file.
func TestMarkdownLinksResolve(t *testing.T) {
	files := markdownFiles(t)
	checked := 0
	for _, f := range files {
		text, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, l := range mdLinks(string(text)) {
			if strings.Contains(l, "://") || strings.HasPrefix(l, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(l, "#")
			target := f
			if path != "" {
				target = filepath.Join(filepath.Dir(f), path)
				_, err := os.Stat(target)
				if !assert.NoError(t, err, "%s links %s", f, l) {
					continue
				}
			}
			if anchor != "" {
				linked, err := os.ReadFile(target)
				require.NoError(t, err, "%s links %s", f, l)
				assert.True(t, mdAnchors(string(linked))[anchor], "%s links %s: no such heading", f, l)
			}
			checked++
		}
	}
	t.Logf("%d relative links in %d files", checked, len(files))
}

func TestMarkdownAnchors(t *testing.T) {
	text := "# Top\n## The node's volume groups at boot\n```\n# not a heading\n```\n### `failed` answers (`P volume.reason`)\n## PVC grown → new size (`make bench-node BENCH=grow`)\n## Top\n"
	assert.Equal(t, map[string]bool{
		"top": true, "the-nodes-volume-groups-at-boot": true, "failed-answers-p-volumereason": true,
		"pvc-grown--new-size-make-bench-node-benchgrow": true, "top-1": true,
	}, mdAnchors(text))
}

// User docs (the README and docs/, but not the run logs of docs/runs/ or the
// CHANGELOG) name no issue numbers and no commits of this repository: a
// reader cannot use them.
func TestUserDocsNameNoIssuesOrCommits(t *testing.T) {
	files := []string{filepath.Join(repoRoot, "README.md")}
	m, err := filepath.Glob(filepath.Join(repoRoot, "docs/*.md"))
	require.NoError(t, err)
	files = append(files, m...)
	for _, f := range files {
		text, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, issue := range issueRef.FindAllString(string(text), -1) {
			assert.Fail(t, "an issue number", "%s names %q", f, strings.TrimSpace(issue))
		}
		for _, h := range hexWord.FindAllString(string(text), -1) {
			if strings.Trim(h, "0123456789") == "" {
				continue // a number
			}
			err := exec.Command("git", "-C", repoRoot, "rev-parse", "--verify", "--quiet", h+"^{commit}").Run()
			assert.Error(t, err, "%s names commit %s", f, h)
		}
	}
}

var (
	issueRef = regexp.MustCompile(`(?i)\bissues? #?\d+|(?:^|[\s(])#\d+\b`)
	hexWord  = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
)

func TestIssueAndCommitPatterns(t *testing.T) {
	assert.Equal(t, []string{"issue 28", " #12"}, issueRef.FindAllString("as issue 28 says; see #12; topolvm/topolvm#555", -1))
	assert.Equal(t, []string{"5a8cf3e", "17bd8b9f710f"}, hexWord.FindAllString("on 5a8cf3e, pinned 17bd8b9f710f, not cafe or deadbeefs", -1))
}

func TestMarkdownLinksOutsideCode(t *testing.T) {
	text := "[a](docs/a.md) and [web](https://x.io \"t\")\n`[not](code.md)`\n```\n[nor](fence.md)\n```\n[r]: ../b.md#part\n"
	assert.Equal(t, []string{"docs/a.md", "https://x.io", "../b.md#part"}, mdLinks(text))
}

var (
	compatRow   = regexp.MustCompile(`(?m)^\|([^|\n]+)\|([^|\n]+)\|([^|\n]+)\|`)
	compatPin   = regexp.MustCompile("`([^`]+)`(?: \\(([^)]*)\\))?")
	compatName  = regexp.MustCompile("`([^`]+)`")
	shellPin    = regexp.MustCompile(`(?m)^([A-Z_]+_VERSION)=\$\{[A-Z_]+:-([^}]+)\}`)
	pseudoHash  = regexp.MustCompile(`-([0-9a-f]{12})$`)
	versionLike = regexp.MustCompile(`^v?\d`)
)

// pinnedVersion is the version NAME pins in FILE: a shell script's
// NAME=${NAME:-VERSION}, go.mod's require of module NAME, a Go file's
// NAME = "...@VERSION" constant.
func pinnedVersion(read func(string) (string, error), file, name string) (string, error) {
	text, err := read(file)
	if err != nil {
		return "", err
	}
	var re *regexp.Regexp
	switch {
	case strings.HasSuffix(file, ".sh"):
		re = regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `=\$\{` + regexp.QuoteMeta(name) + `:-([^}]+)\}`)
	case filepath.Base(file) == "go.mod":
		re = regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(name) + `\s+(\S+)`)
	case strings.HasSuffix(file, ".go"):
		re = regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\s*=\s*"(?:[^"@]*@)?([^"]+)"`)
	default:
		return "", fmt.Errorf("%s: no pins read from this kind of file", file)
	}
	m := re.FindStringSubmatch(text)
	if m == nil {
		return "", fmt.Errorf("%s pins no %s", file, name)
	}
	return m[1], nil
}

// compatProblems checks a compatibility table: each pin a row names
// (`FILE` (`NAME`, ...)) holds a version the row's "version tested" shows
// (a pseudo-version by its commit hash), and every X_VERSION pin of the
// given scripts is named by a row.
func compatProblems(table string, read func(string) (string, error), scripts []string) []string {
	var problems []string
	named := map[string]bool{}
	for _, row := range compatRow.FindAllStringSubmatch(table, -1) {
		tested, where := row[2], row[3]
		for _, pin := range compatPin.FindAllStringSubmatch(where, -1) {
			file := pin[1]
			for _, n := range compatName.FindAllStringSubmatch(pin[2], -1) {
				name := strings.Fields(n[1])[0] // go.mod: "module version"
				named[file+" "+name] = true
				v, err := pinnedVersion(read, file, name)
				if err != nil {
					problems = append(problems, err.Error())
					continue
				}
				want := v
				if h := pseudoHash.FindStringSubmatch(v); h != nil {
					want = h[1]
				}
				if !strings.Contains(tested, want) {
					problems = append(problems, fmt.Sprintf("%s pins %s %s; the table says %q", file, name, v, strings.TrimSpace(tested)))
				}
			}
		}
	}
	for _, s := range scripts {
		text, err := read(s)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		for _, m := range shellPin.FindAllStringSubmatch(text, -1) {
			if versionLike.MatchString(m[2]) && !named[s+" "+m[1]] {
				problems = append(problems, fmt.Sprintf("%s pins %s %s; no row of the table names it", s, m[1], m[2]))
			}
		}
	}
	return problems
}

func TestCompatibilityTable(t *testing.T) {
	table, err := os.ReadFile(filepath.Join(repoRoot, "docs/compatibility.md"))
	require.NoError(t, err)
	read := func(f string) (string, error) {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		return string(b), err
	}
	var scripts []string
	for _, glob := range []string{"scripts/*.sh", "scripts/*/*.sh"} {
		m, err := filepath.Glob(filepath.Join(repoRoot, glob))
		require.NoError(t, err)
		for _, f := range m {
			rel, err := filepath.Rel(repoRoot, f)
			require.NoError(t, err)
			scripts = append(scripts, rel)
		}
	}
	require.NotEmpty(t, scripts)
	assert.Empty(t, compatProblems(string(table), read, scripts))
}

// The check finds a drifted pin, a pin no row names, and a row naming a pin
// that is not there.
func TestCompatibilityDriftIsCaught(t *testing.T) {
	files := map[string]string{
		"scripts/a.sh": "A_VERSION=${A_VERSION:-v1.2.3}\nB_VERSION=${B_VERSION:-v0.9.0}\n",
		"go.mod":       "module x\n\nrequire (\n\tgithub.com/m/n v0.0.0-20200421122210-17bd8b9f710f\n)\n",
		"x_test.go":    "const op = \"github.com/p/q@v0.94.0\"\n",
	}
	read := func(f string) (string, error) {
		if s, ok := files[f]; ok {
			return s, nil
		}
		return "", fmt.Errorf("no file %s", f)
	}
	for _, tc := range []struct {
		name, table string
		problems    int
	}{
		{"agrees", "| a | v1.2.3 | `scripts/a.sh` (`A_VERSION`) |\n| b | v0.9.0 | `scripts/a.sh` (`B_VERSION`) |\n" +
			"| n | 17bd8b9f710f | `go.mod` (`github.com/m/n`) |\n| q | v0.94.0 | `x_test.go` (`op`) |\n", 0},
		{"drifted", "| a | v1.2.2 | `scripts/a.sh` (`A_VERSION`) |\n| b | v0.9.0 | `scripts/a.sh` (`B_VERSION`) |\n", 1},
		{"not named", "| a | v1.2.3 | `scripts/a.sh` (`A_VERSION`) |\n", 1},
		{"no such pin", "| a | v1.2.3 | `scripts/a.sh` (`A_VERSION`, `C_VERSION`) |\n| b | v0.9.0 | `scripts/a.sh` (`B_VERSION`) |\n", 1},
		{"module drifted", "| a | v1.2.3 | `scripts/a.sh` (`A_VERSION`, `B_VERSION`) |\n| n | 0123456789ab | `go.mod` (`github.com/m/n`) |\n", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Len(t, compatProblems(tc.table, read, []string{"scripts/a.sh"}), tc.problems)
		})
	}
}
