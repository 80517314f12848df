package agent

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/agent/luks2"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/devmapper"
)

// Encryption at rest: an LV tagged kube.EncryptionTag holds a LUKS2 header
// (agent/luks2) in its first luks2.DataOffset bytes and the volume's data,
// encrypted, after it. The agent writes the header when it makes the LV,
// loads the dm-crypt mapping over the LV itself (lvmbackend/devmapper) and
// answers with the mapping's path, which the `local` PV names: kubelet
// formats and mounts the mapping as it does a plain LV. After a reboot the
// agent opens the node's encrypted volumes again (OpenEncrypted). A grow
// grows the LV, then the mapping. A delete closes the mapping and destroys
// the header's keyslots and both header copies before anything else
// (crypto-erase): from then on neither the class's key nor a copy of the
// disk opens the volume; the class's wipe then runs or not as it says.
//
// The header, like the wipe and the thick copy, is a write to the LV's
// block device by the agent: the LV is opened exclusively, so nothing can
// have it mounted or mapped meanwhile. The class's key is read from its
// Secret for each use (kube.ReadKey), never kept, logged or written, and
// cleared once used; the volume key lives in the kernel's table and, for
// the moment of a load, in this process.

// Crypt is the agent's encryption: the device-mapper tables it loads and
// where the key Secrets are read.
type Crypt struct {
	dm mapper
	// keyNamespace is the one namespace key Secrets are read from.
	keyNamespace string
	// udev: the node runs udev, which makes /dev/mapper/NAME for a new
	// mapping; without it the agent makes the node itself.
	udev bool
}

// mapper is what Crypt needs of device-mapper (devmapper.Control; the
// tests' fake).
type mapper interface {
	Create(ctx context.Context, name, uuid string, targets []devmapper.Target, readOnly bool) (devmapper.Info, error)
	Reload(ctx context.Context, name string, targets []devmapper.Target) error
	Remove(ctx context.Context, name string) error
	Info(ctx context.Context, name string) (devmapper.Info, error)
}

// Crypt is the agent's encryption over d's device-mapper, reading keys
// from keyNamespace.
func (d *Devices) Crypt(keyNamespace string) *Crypt {
	_, err := os.Stat("/run/udev/control")
	return &Crypt{dm: d.dm, keyNamespace: keyNamespace, udev: err == nil}
}

// CryptName is the device-mapper name of an LV's mapping: "luks-", then
// the device class and the LV's name joined by '-', each with its own '-'
// doubled (as LVM names its devices), so that no two LVs share one.
func CryptName(deviceClass, name string) string {
	esc := func(s string) string { return strings.ReplaceAll(s, "-", "--") }
	return "luks-" + esc(deviceClass) + "-" + esc(name)
}

// encryption is the key Secret an LV's tags name (ok false: a plain LV).
func encryption(lv *lvmbackend.Volume) (kube.KeyRef, bool) {
	ref, ok, err := kube.EncryptionOf(lv.Tags)
	if err != nil {
		// A malformed tag still marks an encrypted LV: never taken as plain.
		return kube.KeyRef{}, true
	}
	return ref, ok
}

// encryptionText says how a volume is encrypted, for errors.
func encryptionText(encrypted bool, ref kube.KeyRef) string {
	if !encrypted {
		return "not encrypted"
	}
	return "encrypted with the key of Secret " + ref.String()
}

// key reads an encrypted class's key; an agent that does not encrypt has
// none to read.
func (a *Agent) key(ctx context.Context, ref kube.KeyRef) (*kube.Key, error) {
	if a.cfg.Crypt == nil {
		return nil, fmt.Errorf("%w: this agent does not encrypt (it has no device-mapper, or --key-namespace is empty)", kube.ErrKeyUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.OpTimeout)
	defer cancel()
	return kube.ReadKey(ctx, a.client, a.cfg.Crypt.keyNamespace, ref)
}

// sealed answers for an encrypted claim's LV, made or found: its header is
// written (format: the LV is new, no answer ever named it, so it holds
// nothing; a header already there is replaced) or else opened with key,
// its mapping loaded unless it is live (a claim answered before and asked
// again), and the answer names the mapping.
func (a *Agent) sealed(ctx context.Context, lv *lvmbackend.Volume, key *kube.Key, format bool) outcome {
	if err := a.cfg.Devices.confirmActive(ctx, lv); err != nil {
		return retry(err)
	}
	c := a.cfg.Crypt
	name := CryptName(lv.DeviceClass, lv.Name)
	if !format {
		_, err := a.mapWith(ctx, lv, key, false)
		switch {
		case errors.Is(err, luks2.ErrWrongKey):
			return fail(kube.ReasonKeyUnavailable, fmt.Errorf("%w: the class's key does not open LV %s/%s", kube.ErrKeyUnavailable, lv.DeviceClass, lv.Name))
		case err != nil:
			return retry(err)
		}
		return outcome{state: kube.StateCreated, device: "/dev/mapper/" + name}
	}
	path, err := a.devicePath(ctx, lv)
	if err != nil {
		return retry(err)
	}
	if path == "" {
		return retry(fmt.Errorf("lvmd reports no device path for LV %s/%s: its header cannot be written", lv.DeviceClass, lv.Name))
	}
	// A mapping left by an attempt cut short holds the LV open.
	if err := c.close(ctx, name, a.cfg.deviceRoot); err != nil {
		return retry(err)
	}
	vol, err := a.header(path, lv.SizeBytes, key)
	if err != nil {
		return retry(fmt.Errorf("LUKS2 header of LV %s/%s: %w", lv.DeviceClass, lv.Name, err))
	}
	defer vol.Clear()
	dev, err := c.open(ctx, name, lv, path, vol, a.cfg.deviceRoot)
	if err != nil {
		return retry(err)
	}
	a.metrics.cryptOpens.Inc()
	return outcome{state: kube.StateCreated, device: dev}
}

// header formats a new LUKS2 header on the LV at path, which nothing may
// hold (a mount, a mapping).
func (a *Agent) header(path string, size int64, key *kube.Key) (*luks2.Volume, error) {
	f, err := os.OpenFile(filepath.Join(a.cfg.deviceRoot, path), os.O_RDWR|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EBUSY) {
		return nil, fmt.Errorf("%w: %s is held exclusively (mounted or mapped)", ErrVolumeOpen, path)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	vol, err := luks2.Format(f, size, key.Current, luks2.Options{})
	if err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		vol.Clear()
		return nil, err
	}
	return vol, nil
}

// unlock opens a header with the class's key. During a rotation (the
// Secret's previousKey set) it also opens one that only the previous key
// opens, and re-keys it: a keyslot of the current key is added, then the
// previous key's destroyed, so the previous key opens the volume only
// until the agent next opens or grows it. A re-key cut short between the
// two leaves both keyslots; the next unlock removes the previous one.
func unlock(f *os.File, size int64, key *kube.Key) (*luks2.Volume, error) {
	vol, err := luks2.Open(f, size, key.Current)
	if key.Previous == nil {
		return vol, err
	}
	switch {
	case err == nil:
		if err := luks2.RemoveKey(f, size, key.Previous); err != nil && !errors.Is(err, luks2.ErrWrongKey) && !errors.Is(err, luks2.ErrLastKeyslot) {
			vol.Clear()
			return nil, fmt.Errorf("remove the previous key's keyslot: %w", err)
		}
	case errors.Is(err, luks2.ErrWrongKey):
		if vol, err = luks2.Open(f, size, key.Previous); err != nil {
			return nil, err
		}
		if err := luks2.AddKey(f, size, key.Previous, key.Current, luks2.Options{}); err != nil {
			vol.Clear()
			return nil, fmt.Errorf("add the current key's keyslot: %w", err)
		}
		if err := luks2.RemoveKey(f, size, key.Previous); err != nil {
			vol.Clear()
			return nil, fmt.Errorf("remove the previous key's keyslot: %w", err)
		}
		klog.InfoS("Encrypted volume re-keyed to its class's current key", "device", f.Name())
	default:
		return nil, err
	}
	return vol, f.Sync()
}

// table is the dm-crypt table of lv's mapping: the whole LV after its
// header, over the LV's device numbers (its path when lvmd reports none).
func table(lv *lvmbackend.Volume, path string, vol *luks2.Volume) ([]devmapper.Target, error) {
	sectors := (lv.SizeBytes - vol.Offset) / 512
	if sectors <= 0 {
		return nil, fmt.Errorf("LV %s/%s (%d bytes) is too small for its LUKS2 header", lv.DeviceClass, lv.Name, lv.SizeBytes)
	}
	backing := path
	if lv.DevMajor != 0 || lv.DevMinor != 0 {
		backing = fmt.Sprintf("%d:%d", lv.DevMajor, lv.DevMinor)
	}
	return []devmapper.Target{{Start: 0, Length: uint64(sectors), Type: "crypt", Params: vol.TableParams(backing)}}, nil
}

// open loads the mapping name over lv (unless it is live already) and
// returns its path, once the node's /dev has it.
func (c *Crypt) open(ctx context.Context, name string, lv *lvmbackend.Volume, path string, vol *luks2.Volume, root string) (string, error) {
	dev := "/dev/mapper/" + name
	t, err := table(lv, path, vol)
	if err != nil {
		return "", err
	}
	info, err := c.dm.Info(ctx, name)
	switch {
	case err == nil && info.LiveTable && !info.Suspended:
	case err == nil:
		// Half made (no live table, or suspended): made again.
		if err := c.dm.Remove(ctx, name); err != nil {
			return "", fmt.Errorf("mapping %s is half made and cannot be removed: %w", name, err)
		}
		fallthrough
	case errors.Is(err, devmapper.ErrNotFound):
		uuid := "CRYPT-LUKS2-" + strings.ReplaceAll(vol.UUID, "-", "") + "-" + name
		if info, err = c.dm.Create(ctx, name, uuid, t, false); err != nil {
			return "", fmt.Errorf("load the dm-crypt mapping %s: %w", name, err)
		}
	default:
		return "", fmt.Errorf("read mapping %s: %w", name, err)
	}
	return dev, c.node(filepath.Join(root, dev), info)
}

// node makes sure the mapping's /dev/mapper path exists: udev makes it
// (a link to /dev/dm-N) within moments; without udev (a node without it,
// or an agent in a container, which sees no /run/udev), the agent makes
// the block device node itself at once, as libdevmapper does when it does
// not sync with udev (a udev that comes second keeps the node).
func (c *Crypt) node(path string, info devmapper.Info) error {
	deadline := time.Now().Add(2 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if !c.udev || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // udev's work has no event we can wait on here
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	err := unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(info.Major, info.Minor)))
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("make %s (%d:%d): %w", path, info.Major, info.Minor, err)
	}
	return nil
}

// close removes the mapping name if it exists, and its /dev/mapper node
// (one the agent made; udev removes its own link); one in use is an error
// (ErrVolumeOpen) to retry once its user lets go.
func (c *Crypt) close(ctx context.Context, name, root string) error {
	err := c.dm.Remove(ctx, name)
	switch {
	case err == nil, errors.Is(err, devmapper.ErrNotFound):
	case errors.Is(err, devmapper.ErrBusy):
		return fmt.Errorf("%w: the mapping %s is in use", ErrVolumeOpen, name)
	default:
		return fmt.Errorf("remove the mapping %s: %w", name, err)
	}
	if err := os.Remove(filepath.Join(root, "/dev/mapper", name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove /dev/mapper/%s: %w", name, err)
	}
	return nil
}

// mapped opens an encrypted LV's mapping with ref's key, read now, when
// it is not live (after a reboot, or a mapping removed by hand), and with
// reload loads its table again when it is (a grow: at the LV's new size).
// It returns the size of the volume the mapping shows. A live mapping
// that is not to be reloaded needs no key.
func (a *Agent) mapped(ctx context.Context, lv *lvmbackend.Volume, ref kube.KeyRef, reload bool) (int64, error) {
	if info, err := a.cfg.Crypt.dm.Info(ctx, CryptName(lv.DeviceClass, lv.Name)); err == nil && info.LiveTable && !info.Suspended && !reload {
		return lv.SizeBytes - luks2.DataOffset, nil
	}
	key, err := a.key(ctx, ref)
	if err != nil {
		return 0, err
	}
	defer key.Clear()
	return a.mapWith(ctx, lv, key, reload)
}

// mapWith is mapped with the key in hand: the header opened (and re-keyed
// during a rotation), then the mapping loaded, or loaded again (reload),
// or, live, left as it is.
func (a *Agent) mapWith(ctx context.Context, lv *lvmbackend.Volume, key *kube.Key, reload bool) (int64, error) {
	c := a.cfg.Crypt
	name := CryptName(lv.DeviceClass, lv.Name)
	info, err := c.dm.Info(ctx, name)
	live := err == nil && info.LiveTable && !info.Suspended
	if live && !reload {
		return lv.SizeBytes - luks2.DataOffset, c.node(filepath.Join(a.cfg.deviceRoot, "/dev/mapper", name), info)
	}
	path, err := a.devicePath(ctx, lv)
	if err != nil {
		return 0, err
	}
	// Not exclusively: a live mapping holds the LV (a re-key writes only
	// the header, which the mapping does not cover).
	f, err := os.OpenFile(filepath.Join(a.cfg.deviceRoot, path), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	vol, err := unlock(f, lv.SizeBytes, key)
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("LUKS2 header of LV %s/%s: %w", lv.DeviceClass, lv.Name, err)
	}
	defer vol.Clear()
	if !live {
		if _, err := c.open(ctx, name, lv, path, vol, a.cfg.deviceRoot); err != nil {
			return 0, err
		}
		a.metrics.cryptOpens.Inc()
		return lv.SizeBytes - vol.Offset, nil
	}
	t, err := table(lv, path, vol)
	if err != nil {
		return 0, err
	}
	if err := c.dm.Reload(ctx, name, t); err != nil {
		return 0, fmt.Errorf("grow the mapping %s: %w", name, err)
	}
	return lv.SizeBytes - vol.Offset, nil
}

// erase is a delete's first write to an encrypted LV: its mapping closed
// (in use: the delete waits), then its header destroyed (luks2.Erase),
// so that nothing opens it again, whatever happens to the LV after.
func (a *Agent) erase(ctx context.Context, lv *lvmbackend.Volume) error {
	if a.cfg.Crypt == nil {
		return fmt.Errorf("LV %s/%s is encrypted, and this agent cannot erase it (no device-mapper); it is left as it is", lv.DeviceClass, lv.Name)
	}
	if err := a.cfg.Crypt.close(ctx, CryptName(lv.DeviceClass, lv.Name), a.cfg.deviceRoot); err != nil {
		return err
	}
	path, err := a.devicePath(ctx, lv)
	if err != nil {
		return err
	}
	if path == "" {
		return fmt.Errorf("LV %s/%s has no device path: its header cannot be erased", lv.DeviceClass, lv.Name)
	}
	f, err := os.OpenFile(filepath.Join(a.cfg.deviceRoot, path), os.O_RDWR|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("%w: %s is held exclusively", ErrVolumeOpen, path)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	switch err := luks2.Erase(f, lv.SizeBytes); {
	case errors.Is(err, luks2.ErrNotLUKS2):
		// No header was ever written (a create cut short after lvcreate):
		// no key material to destroy. Erase wrote nothing.
		klog.InfoS("Encrypted LV holds no LUKS2 header: nothing to erase", "lv", lv.DeviceClass+"/"+lv.Name)
		return nil
	case err != nil:
		return fmt.Errorf("erase the LUKS2 header of LV %s/%s: %w", lv.DeviceClass, lv.Name, err)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	a.metrics.cryptErases.Inc()
	klog.InfoS("Encrypted LV erased: its keyslots and headers are destroyed", "lv", lv.DeviceClass+"/"+lv.Name)
	return nil
}

// removeLV removes an LV through lvmd, its mapping closed first (an LV
// made for a claim that went away meanwhile, or an orphan): an encrypted
// one is erased before, so its header never outlives its claim.
func (a *Agent) removeLV(ctx context.Context, lv *lvmbackend.Volume) error {
	if _, ok := encryption(lv); ok {
		if err := a.erase(ctx, lv); err != nil {
			return err
		}
	}
	err := a.backend.RemoveVolume(ctx, lv.DeviceClass, lv.Name)
	if errors.Is(err, lvmbackend.ErrNotFound) {
		return nil
	}
	return err
}

// openEncrypted runs OpenEncrypted from the agent's start until a pass
// leaves nothing unopened (lvmd away, a key Secret missing or out of reach
// at first), backing off up to a minute between passes.
func (a *Agent) openEncrypted(ctx context.Context) {
	if a.cfg.Crypt == nil {
		return
	}
	b := wait.Backoff{Duration: time.Second, Factor: 2, Steps: math.MaxInt32, Cap: time.Minute}
	_ = wait.ExponentialBackoffWithContext(ctx, b, func(ctx context.Context) (bool, error) {
		return a.OpenEncrypted(ctx) == 0, nil
	})
}

// OpenEncrypted opens the mappings of the node's encrypted volumes that
// are not open (after a reboot, a power cut, or a mapping removed by
// hand), so that kubelet finds their devices: each LV of every device
// class that carries an ownership and an encryption tag. One whose header
// no longer opens as LUKS2 (a delete erased it and was cut short) is
// passed over: its delete resumes. It logs what it did and how long it
// took, and returns how many it could not open.
func (a *Agent) OpenEncrypted(ctx context.Context) (failed int) {
	start := time.Now()
	caps, err := a.backend.Capacity(ctx)
	if err != nil {
		klog.ErrorS(err, "Encrypted volumes not opened: lvmd's device classes cannot be read")
		return 1
	}
	open, erased := 0, 0
	for _, c := range caps {
		lvs, err := a.backend.ListVolumes(ctx, c.DeviceClass)
		if err != nil {
			klog.ErrorS(err, "Encrypted volumes of a device class not opened", "deviceClass", c.DeviceClass)
			failed++
			continue
		}
		for i := range lvs {
			lv := &lvs[i]
			ref, enc := encryption(lv)
			if _, ours := OwnerUID(lv); !enc || !ours {
				continue
			}
			err := a.reopen(ctx, lv, ref)
			switch {
			case err == nil:
				open++
			case errors.Is(err, luks2.ErrNotLUKS2):
				erased++
			default:
				failed++
				klog.ErrorS(err, "Encrypted volume not opened", "lv", lv.DeviceClass+"/"+lv.Name)
			}
		}
	}
	klog.InfoS("Encrypted volumes opened", "open", open, "erased", erased, "failed", failed, "took", time.Since(start))
	return failed
}

// reopen opens one encrypted LV's mapping, under the LV's operation lock.
func (a *Agent) reopen(ctx context.Context, lv *lvmbackend.Volume, ref kube.KeyRef) error {
	t := target{lv.DeviceClass, lv.Name}
	if !a.acquire(t) {
		return errBusy
	}
	defer a.release(t)
	_, err := a.mapped(ctx, lv, ref, false)
	return err
}
