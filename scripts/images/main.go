// Command images writes a container image as a docker image tarball (which
// `ctr images import` and `docker load` read) from files on disk, with no
// container engine: the guest's one-node cluster imports the images it runs,
// so nothing is ever pulled. It lives under scripts/ with the other asset
// builders: it is a build tool of the test guest, not part of the product.
//
//	images --out FILE --ref NAME:TAG [--arch amd64] [--entrypoint /bin,arg]
//	       [--link TARGET=PATH]... SRC=PATH...
//
// Each SRC=PATH puts the file SRC at PATH in the image's one layer (mode kept);
// each --link makes PATH a symbolic link to TARGET. Parent directories are
// made as needed.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type pairs []string

func (p *pairs) String() string     { return strings.Join(*p, " ") }
func (p *pairs) Set(v string) error { *p = append(*p, v); return nil }

func main() {
	var links pairs
	out := flag.String("out", "", "the image tarball to write")
	ref := flag.String("ref", "", "the image's name and tag, e.g. ghcr.io/lvm-agent/lvm-agent:dev")
	arch := flag.String("arch", "amd64", "the image's architecture (GOARCH spelling)")
	entrypoint := flag.String("entrypoint", "", "comma-separated entrypoint")
	flag.Var(&links, "link", "TARGET=PATH: a symbolic link in the image (repeatable)")
	flag.Parse()
	if *out == "" || *ref == "" || flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := write(*out, *ref, *arch, *entrypoint, flag.Args(), links); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func write(out, ref, arch, entrypoint string, files, links []string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("--ref: %w", err)
	}
	layerTar, err := buildLayer(files, links)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", arch
	if entrypoint != "" {
		cfg.Config.Entrypoint = strings.Split(entrypoint, ",")
	}
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return fmt.Errorf("image config: %w", err)
	}
	// A temporary name of its own: make test's images step and the guest's
	// files build the same tarball side by side.
	f, err := os.CreateTemp(filepath.Dir(out), filepath.Base(out)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	f.Close()
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", out, err)
	}
	return os.Rename(tmp, out)
}

// buildLayer returns one layer's tar: the files, the links, and every parent
// directory of both, in path order, owned by root, with a fixed time so that
// the same inputs give the same image digest.
func buildLayer(files, links []string) ([]byte, error) {
	type entry struct {
		hdr  tar.Header
		body []byte
	}
	epoch := time.Unix(0, 0)
	entries := map[string]entry{}
	addDirs := func(p string) {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			entries[d] = entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: epoch}}
		}
	}
	for _, f := range files {
		src, dst, ok := strings.Cut(f, "=")
		if !ok || !path.IsAbs(dst) {
			return nil, fmt.Errorf("%q: want SRC=/PATH", f)
		}
		body, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		st, err := os.Stat(src)
		if err != nil {
			return nil, err
		}
		addDirs(dst)
		entries[dst] = entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: int64(st.Mode().Perm()), Size: int64(len(body)), ModTime: epoch}, body: body}
	}
	for _, l := range links {
		target, dst, ok := strings.Cut(l, "=")
		if !ok || !path.IsAbs(dst) {
			return nil, fmt.Errorf("--link %q: want TARGET=/PATH", l)
		}
		addDirs(dst)
		entries[dst] = entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(dst, "/"), Linkname: target, Mode: 0o777, ModTime: epoch}}
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := entries[n]
		if err := tw.WriteHeader(&e.hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
