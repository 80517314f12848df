package main

import (
	"bytes"
	"flag"
	"fmt"
	"regexp"
)

// longFlag is a flag's line in the flag package's PrintDefaults output whose
// name is longer than one letter.
var longFlag = regexp.MustCompile(`(?m)^  -([^-\s]\S+)`)

// printFlags prints a flag set's flags as kubectl, kubelet and TopoLVM do:
// --name, and -n for a one-letter name. The flag package accepts -name and
// --name alike, so only the help changes.
func printFlags(fs *flag.FlagSet) {
	var b bytes.Buffer
	out := fs.Output()
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(out)
	fmt.Fprint(out, longFlag.ReplaceAllString(b.String(), "  --$1"))
}
