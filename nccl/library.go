package nccl

import (
	"cmp"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
)

// Libraries names the shared objects to load. An empty field means the
// path in the environment variable EnvNCCL (EnvCUDA) when it is set, and
// otherwise the standard name, found by the dynamic loader's search
// (LD_LIBRARY_PATH, the ld.so cache). pip's nvidia-nccl-cu12 package puts
// libnccl.so.2 in its lib directory, which the loader does not search:
// point EnvNCCL (or Libraries.NCCL) at it.
type Libraries struct {
	NCCL string // default $DDPGO_NCCL_LIBRARY, else "libnccl.so.2"
	CUDA string // default $DDPGO_CUDA_LIBRARY, else "libcuda.so.1"
}

// The environment variables that name the libraries when Libraries'
// fields are empty.
const (
	EnvNCCL = "DDPGO_NCCL_LIBRARY"
	EnvCUDA = "DDPGO_CUDA_LIBRARY"
)

func (l Libraries) withDefaults() Libraries {
	if l.NCCL == "" {
		l.NCCL = cmp.Or(os.Getenv(EnvNCCL), "libnccl.so.2")
	}
	if l.CUDA == "" {
		l.CUDA = cmp.Or(os.Getenv(EnvCUDA), "libcuda.so.1")
	}
	return l
}

// Library is a loaded pair of libnccl.so.2 and libcuda.so.1: a dispatch
// table of their functions filled by dlsym, checked for the symbols and
// the NCCL version this package needs. Communicators are made from it. A
// Library is safe for concurrent use and lives for the process (the
// libraries are never unloaded).
type Library struct {
	d       driver
	paths   Libraries
	version int
	syms    map[string]bool
	standIn string

	initOnce sync.Once
	initErr  error

	mu   sync.Mutex
	devs map[int]*device

	// launches counts the launches of every communicator made from the
	// Library (a group, or one operation, handed to NCCL) and inProgress
	// those that answered ncclInProgress; see Launches.
	launches, inProgress atomic.Uint64
}

// Launches returns how many launches the communicators made from l have
// handed to NCCL (a group between ncclGroupStart and ncclGroupEnd, or one
// operation), and how many of them answered ncclInProgress: NCCL enqueued
// them from its own thread and the launch waited for that before it
// returned (see the package doc). On NCCL 2.23 and newer nearly every
// launch of a communicator of more than one rank answers it, not all
// (docs/lab/nccl-gpu.md has counts from a GPU).
func (l *Library) Launches() (launches, inProgress uint64) {
	return l.launches.Load(), l.inProgress.Load()
}

var (
	defaultOnce sync.Once
	defaultLib  *Library
	defaultErr  error
)

// Default returns the Library of the default names (Libraries{}: the
// environment's, else the standard ones), opened once.
func Default() (*Library, error) {
	defaultOnce.Do(func() { defaultLib, defaultErr = Open(Libraries{}) })
	return defaultLib, defaultErr
}

// Open loads the libraries, fills the dispatch table and checks that
// every required symbol is there and that NCCL is at least MinVersion. It
// needs no GPU: the driver is initialised on first use of a device. A
// missing library or symbol is a *LoadError that says what to install;
// an old NCCL wraps ErrVersion.
func Open(l Libraries) (*Library, error) {
	return open(l, nil)
}

func open(l Libraries, hide map[string]bool) (*Library, error) {
	l = l.withDefaults()
	d, syms, err := openDriver(l.NCCL, l.CUDA, hide)
	if err != nil {
		return nil, err
	}
	lib := &Library{d: d, paths: l, syms: map[string]bool{}, devs: map[int]*device{}, standIn: d.standIn()}
	for _, s := range syms {
		lib.syms[s.name] = s.present
	}
	// ncclGetVersion first, so that a missing symbol of an old NCCL is
	// reported as the version it is.
	if lib.syms["ncclGetVersion"] {
		if lib.version, err = d.ncclVersion(); err != nil {
			d.close()
			return nil, err
		}
	}
	for _, s := range syms {
		if s.present || !s.required {
			continue
		}
		d.close()
		path := l.CUDA
		if s.nccl {
			path = l.NCCL
			if lib.version > 0 && lib.version < max(s.since, MinVersion) {
				return nil, fmt.Errorf("%w: %s is NCCL %s; this package needs %s or newer (%s appeared in %s)",
					ErrVersion, path, VersionString(lib.version), VersionString(MinVersion), s.name, VersionString(max(s.since, 20000)))
			}
		}
		return nil, &LoadError{Library: path, Symbol: s.name, Since: s.since, Reason: "dlsym found nothing", cuda: !s.nccl}
	}
	if lib.version < MinVersion {
		d.close()
		return nil, fmt.Errorf("%w: %s is NCCL %s; this package needs %s or newer (non-blocking communicators, ncclCommInitRankConfig)",
			ErrVersion, l.NCCL, VersionString(lib.version), VersionString(MinVersion))
	}
	return lib, nil
}

// Version returns the NCCL version code (ncclGetVersion), e.g. 22105 for
// 2.21.5.
func (l *Library) Version() int { return l.version }

// Paths returns the libraries as they were opened.
func (l *Library) Paths() Libraries { return l.paths }

// StandIn describes the library when it is ddpgo's test stand-in
// (testdata/standin, which exports ddpgo_standin), and is "" when it is
// not. Over the stand-in nothing runs on a GPU: a program that reports
// figures measured through a Library says so when StandIn is not empty.
func (l *Library) StandIn() string { return l.standIn }

// Has reports whether the optional symbol name was found (ncclMemAlloc,
// ncclMemFree, ncclCommRegister, ncclCommDeregister, ncclGetLastError).
func (l *Library) Has(name string) bool { return l.syms[name] }

// Missing returns the optional symbols that are absent, sorted.
func (l *Library) Missing() []string {
	var m []string
	for n, ok := range l.syms {
		if !ok {
			m = append(m, n)
		}
	}
	sort.Strings(m)
	return m
}

// init initialises the CUDA driver once.
func (l *Library) init() error {
	l.initOnce.Do(func() {
		if err := l.d.cuInit(); err != nil {
			l.initErr = fmt.Errorf("nccl: initialising the CUDA driver (%s): %w", l.paths.CUDA, err)
		}
	})
	return l.initErr
}

// NewUniqueID returns a new NCCL unique id (ncclGetUniqueId), which rank 0
// creates and every rank of the new communicator must be given.
func (l *Library) NewUniqueID() (UniqueID, error) {
	if err := l.init(); err != nil {
		return UniqueID{}, err
	}
	return l.d.uniqueID()
}

// UniqueID is ncclUniqueId: 128 opaque bytes, passed by value.
type UniqueID [128]byte

// Info describes the libraries and devices, for `ddpbench info`.
type Info struct {
	NCCL          string // path or name loaded
	NCCLVersion   int    // ncclGetVersion's code, 0 if NCCL was not loaded
	CUDA          string
	DriverVersion int // cuDriverGetVersion's value, 0 if unknown
	Devices       []DeviceInfo
	Missing       []string // optional NCCL symbols that are absent
	// StandIn is Library.StandIn: not empty when the libraries loaded
	// are the test stand-in, not NCCL.
	StandIn string
	Err     error // why the rest is incomplete, nil if it is not
}

// DeviceInfo describes one CUDA device.
type DeviceInfo struct {
	Ordinal      int
	Name         string
	Major, Minor int // compute capability
}

// String formats i on a few lines.
func (i Info) String() string {
	s := "nccl: "
	if i.StandIn != "" {
		s += "STAND-IN (" + i.StandIn + "), "
	}
	if i.NCCLVersion > 0 {
		s += fmt.Sprintf("NCCL %s (%s)", VersionString(i.NCCLVersion), i.NCCL)
	} else {
		s += "NCCL not loaded"
	}
	if i.DriverVersion > 0 {
		s += fmt.Sprintf(", CUDA driver API %s (%s)", DriverVersionString(i.DriverVersion), i.CUDA)
	}
	s += fmt.Sprintf(", %d device(s)", len(i.Devices))
	for _, d := range i.Devices {
		s += fmt.Sprintf("\n  device %d: %s, compute capability %d.%d", d.Ordinal, d.Name, d.Major, d.Minor)
	}
	if len(i.Missing) > 0 {
		s += fmt.Sprintf("\n  optional symbols absent: %v", i.Missing)
	}
	if i.Err != nil {
		s += "\n  " + i.Err.Error()
	}
	return s
}

// GetInfo reports the NCCL version (which needs no GPU), the driver's
// version and the devices, as far as it can: what it could not find is in
// Info.Err.
func GetInfo(l Libraries) Info {
	l = l.withDefaults()
	info := Info{NCCL: l.NCCL, CUDA: l.CUDA}
	lib, err := Open(l)
	if err != nil {
		info.Err = err
		return info
	}
	return lib.Info()
}

// Info is GetInfo for an open Library.
func (l *Library) Info() Info {
	info := Info{NCCL: l.paths.NCCL, CUDA: l.paths.CUDA, NCCLVersion: l.version, Missing: l.Missing(), StandIn: l.standIn}
	if v, err := l.d.driverVersion(); err == nil {
		info.DriverVersion = v
	} else {
		info.Err = err
		return info
	}
	if err := l.init(); err != nil {
		info.Err = err
		return info
	}
	n, err := l.d.deviceCount()
	if err != nil {
		info.Err = err
		return info
	}
	for i := range n {
		di := DeviceInfo{Ordinal: i}
		di.Name, err = l.d.deviceName(i)
		if err == nil {
			di.Major, err = l.d.deviceAttr(i, attrComputeMajor)
		}
		if err == nil {
			di.Minor, err = l.d.deviceAttr(i, attrComputeMinor)
		}
		if err != nil {
			info.Err = fmt.Errorf("nccl: device %d: %w", i, err)
			return info
		}
		info.Devices = append(info.Devices, di)
	}
	return info
}
