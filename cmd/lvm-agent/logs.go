package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"

	"k8s.io/klog/v2"
)

// logFlags are the logging flags: of klog's many, only verbosity, plus the
// output format.
type logFlags struct {
	format string
}

func (l *logFlags) addFlags(fs *flag.FlagSet) {
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	for _, name := range []string{"v", "vmodule"} {
		f := klogFlags.Lookup(name)
		fs.Var(f.Value, f.Name, f.Usage)
	}
	fs.StringVar(&l.format, "log-format", "text", "log format on stderr: text (klog's) or json (one object per line, through log/slog)")
}

// setup applies --log-format. klog keeps filtering by --v and --vmodule;
// json hands every message it lets through to slog's JSON handler, whose
// own level is opened all the way down so that klog's verbosity decides.
func (l logFlags) setup() error {
	switch l.format {
	case "text":
		return nil
	case "json":
		h := slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.Level(-128)})
		klog.SetSlogLogger(slog.New(h))
		return nil
	}
	return fmt.Errorf("--log-format must be text or json, not %q", l.format)
}
