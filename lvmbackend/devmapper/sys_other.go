//go:build !linux

package devmapper

import "errors"

// openControl: device-mapper exists only on Linux; elsewhere Open fails the
// same way it does on a Linux node without dm-mod, so callers need no
// build tags of their own.
func openControl(path string) (ioctlFunc, func() error, error) {
	return nil, nil, &Error{Op: "open", Target: path, Kind: ErrUnsupported, Err: errors.New("device-mapper is Linux-only")}
}
