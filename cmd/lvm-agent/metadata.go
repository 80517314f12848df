package main

import (
	"flag"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/devmapper"
)

// metadataOptions are the flags of the direct LVM metadata reader.
type metadataOptions struct {
	mode, lvmdConfig, devices string
}

func (o *metadataOptions) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.mode, "lvm-metadata", "auto", "auto: read volumes and capacity from the on-disk LVM metadata (verified; lvmd answers whenever it cannot be read or verified, logged and counted in lvm_agent_lvm_metadata_fallbacks_total), writes still through lvmd; off: every read through lvmd. topolvm's lvmd only")
	fs.StringVar(&o.lvmdConfig, "lvmd-config", "/etc/topolvm/lvmd.yaml", "topolvm lvmd's configuration, for the VG and thin pool of each device class (--lvm-metadata=auto; unreadable: reads through lvmd)")
	fs.StringVar(&o.devices, "lvm-metadata-devices", "", "block devices to scan for LVM physical volumes, comma-separated globs such as /dev/sd*,/dev/nvme* (empty: every device in /proc/partitions but device-mapper's; required when lvm uses a devices file)")
}

// withMetadata wraps an lvmd backend in the direct reader when the flags
// ask for it and it can be set up; otherwise it returns lvmd alone and
// says why.
func withMetadata(b lvmbackend.Backend, o options) (lvmbackend.Backend, error) {
	switch o.meta.mode {
	case "off":
		return b, nil
	case "auto":
	default:
		return nil, fmt.Errorf("--lvm-metadata must be auto or off, not %q", o.meta.mode)
	}
	off := func(why string, err error) (lvmbackend.Backend, error) {
		klog.InfoS("Not reading LVM metadata directly; every read goes through lvmd", "reason", why, "err", err)
		return b, nil
	}
	if o.backend != "topolvm" {
		return off("--backend "+o.backend+" has no lvmd config to map device classes to volume groups", nil)
	}
	classes, err := lvmbackend.ClassesFromLVMDConfig(o.meta.lvmdConfig)
	if err != nil {
		return off("cannot read --lvmd-config", err)
	}
	path := o.dmControl
	if path == "" {
		path = devmapper.DefaultControlPath
	}
	dm, err := devmapper.Open(path)
	if err != nil {
		return off("cannot open device-mapper (active state and device numbers)", err)
	}
	return lvmbackend.NewDirect(b, lvmbackend.DirectConfig{Classes: classes, Devices: splitList(o.meta.devices),
		DM: dm, Closer: dm, DevicesFile: lvmbackend.DefaultDevicesFile}), nil
}
