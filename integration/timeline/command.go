package timeline

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// Command is `lvm-stories timeline`: the report's hop tables on out, and
// the picture with -svg. The files are the bench's, in its order (watch.log
// gone.log grown.log, then the logs); one that cannot be read is named on
// errOut and left out, so that a bench whose phase failed still gets the
// rest of its timeline. With -medians, the medians are a report's instead.
func Command(args []string, out, errOut io.Writer) int {
	fs := flag.NewFlagSet("lvm-stories timeline", flag.ContinueOnError)
	fs.SetOutput(errOut)
	svg := fs.String("svg", "", "write the timeline's picture (SVG) to this file")
	title := fs.String("title", "", "the picture's title")
	medians := fs.String("medians", "", "read the medians from this report's hop tables (a run whose records are gone), not from FILEs")
	fs.Usage = func() {
		fmt.Fprintln(errOut, "usage: lvm-stories timeline [-svg FILE] [-title TEXT] FILE...   (make bench-peers' records: watch.log gone.log grown.log logs...)")
		fmt.Fprintln(errOut, "       lvm-stories timeline -medians REPORT [-svg FILE] [-title TEXT]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if (*medians == "") == (fs.NArg() == 0) {
		fs.Usage()
		return 2
	}
	var res *Result
	if *medians != "" {
		f, err := os.Open(*medians)
		if err == nil {
			res, err = ParseReport(f)
			err = errors.Join(err, f.Close())
		}
		if err != nil {
			fmt.Fprintf(errOut, "timeline: %s: %v\n", *medians, err)
			return 1
		}
	} else {
		rec := NewRecords()
		for _, path := range fs.Args() {
			if err := rec.ReadFile(path); err != nil {
				fmt.Fprintf(errOut, "timeline: left out: %v\n", err)
			}
		}
		res = rec.Result()
	}
	if err := res.WriteReport(out); err != nil {
		fmt.Fprintln(errOut, "timeline:", err)
		return 1
	}
	if *svg != "" {
		b := &bytes.Buffer{}
		if err := res.WriteSVG(b, *title); err != nil {
			fmt.Fprintln(errOut, "timeline:", err)
			return 1
		}
		if err := os.WriteFile(*svg, b.Bytes(), 0o644); err != nil {
			fmt.Fprintln(errOut, "timeline:", err)
			return 1
		}
	}
	return 0
}
