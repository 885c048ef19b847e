// Command ddpbench benchmarks ddpgo: data-parallel training steps over a
// model manifest (run, sweep), nccl-tests style collective sweeps
// (collective) and the environment (info). With no arguments it runs
// `ddpbench run` with defaults that finish in a few seconds.
//
// A command's flags follow it. Flags with no command are run's
// (`ddpbench --ranks 3` is `ddpbench run --ranks 3`), and a command
// written after them is refused, naming them, rather than run without
// them. --version prints the module's version as the go command recorded
// it and the Go toolchain.
//
// --backend inproc (the default) runs --ranks goroutines in this process.
// Built with -tags mpi, --backend mpi runs one rank per process under
// mpirun (mpirun -np 2 ddpbench run --backend mpi): every process runs its
// rank, and rank 0 prints the whole job's results, gathered through the
// communicator. run's table ends with each rank's process id and host; its
// JSON and sweep's carry them (rank_hosts, hosts), the library the backend
// runs on (library) and, on mpi, what the backend chose for Open MPI, as
// the table's header says it (transport). --backend nccl runs one rank per GPU: --ranks ranks of
// this process when no launcher started it, else one rank per process
// under mpirun or torchrun, as mpi does; its buffers and gradients are in
// device memory, and its outputs name the library loaded (set
// DDPGO_NCCL_LIBRARY and DDPGO_CUDA_LIBRARY to choose it) and say so when
// it is the test stand-in, whose figures say nothing about a GPU. On
// nccl, run and collective also read each rank's GPU through NVML
// (libnvidia-ml.so.1, opened at run time) every --telemetry-interval
// during the timed region, and show the median and peak of its
// utilisation, memory used, power, and PCIe and NVLink throughput; where
// NVML cannot be had, they say so once on standard error and print what
// they print without it. A launched job's rank 0 shows its own GPU's.
//
// Every flag can also be set through an environment variable named
// DDPBENCH_ followed by the flag's name in upper case with dashes as
// underscores (--bucket-cap-mb: DDPBENCH_BUCKET_CAP_MB). A flag given on
// the command line wins over the variable.
//
// The exit status follows one rule (exitRule, printed by --help): 0 when
// the benchmark ran and its results are right; 1 when it ran and failed
// (wrong results, a timeout, a backend error, an output that could not be
// written); 2 when it did not run because its input is invalid (a flag,
// a DDPBENCH_ variable, a manifest file, an output path, more memory than
// the machine has); 130 when it was interrupted, after printing what it
// had measured.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"
)

func main() {
	// The first interrupt cancels the run, which then stops its ranks,
	// erases the progress bar and exits; a second one kills at once.
	ctx, cancel := context.WithCancelCause(context.Background())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		signal.Stop(sig)
		cancel(interruptCause(s))
	}()
	os.Exit(runMainContext(ctx, os.Args, os.Stdout, os.Stderr))
}

// runMain runs the command line args and returns the exit status. Every
// error is reported as one line on stderr.
func runMain(args []string, stdout, stderr io.Writer) int {
	return runMainContext(context.Background(), args, stdout, stderr)
}

// runMainContext is runMain with a context whose cancellation interrupts
// the run: exit status 130, as a shell reports an interrupted command.
func runMainContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	app.Metadata = map[string]any{"args": args} // for unexpectedArg and rankError
	if err := app.RunContext(ctx, withCommand(args)); err != nil {
		line, code := report(ctx, err, args)
		if line != "" {
			fmt.Fprintf(stderr, "ddpbench: %s\n", line)
		}
		return code
	}
	return 0
}

// report returns the line that says what err is (without the program's
// name; empty if it was said already) and the exit status it ends the
// command with.
func report(ctx context.Context, err error, args []string) (string, int) {
	var re rankError
	if errors.As(err, &re) {
		if re.said {
			return "", re.code
		}
		line, _ := report(ctx, re.err, args)
		return fmt.Sprintf("rank %d of %d: %s", re.rank, re.size, line), re.code
	}
	if ctx.Err() != nil {
		var in interruptedError
		if errors.As(err, &in) {
			return in.msg, 130
		}
		return "interrupted", 130
	}
	msg := oneLine(err)
	var u usageError
	if errors.As(err, &u) {
		return msg + fromEnv(msg, args), 2
	}
	return msg, 1
}

// rankError is the error of one rank of a launched job, which ends with
// code, the exit status of the rank at fault, on every rank. said: its
// line was written already (or is not this rank's to write).
type rankError struct {
	rank, size int
	code       int
	said       bool
	err        error
}

func (e rankError) Error() string { return fmt.Sprintf("rank %d of %d: %v", e.rank, e.size, e.err) }
func (e rankError) Unwrap() error { return e.err }

// flagAtStart matches the flag a usage error begins with: "--ranks" or
// "-b/--minbytes".
var flagAtStart = regexp.MustCompile(`^(?:-([A-Za-z])/)?--([a-z0-9-]+)\b`)

// fromEnv says which variable set the value a usage error complains
// about, when the flag it names is not on the command line but its
// DDPBENCH_ variable is set: otherwise "--ranks 0" would puzzle a user
// who never typed --ranks.
func fromEnv(msg string, args []string) string {
	m := flagAtStart.FindStringSubmatch(msg)
	if m == nil {
		return ""
	}
	env := envName(m[2])
	if _, set := os.LookupEnv(env); !set {
		return ""
	}
	for _, a := range args[min(1, len(args)):] {
		if a == "--" {
			break
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && (name == m[2] || m[1] != "" && name == m[1]) {
			return ""
		}
	}
	return " (from " + env + ")"
}

// withCommand returns args with the default command, run, inserted when
// none is given: "ddpbench" and "ddpbench --ranks 3" are "ddpbench run"
// and "ddpbench run --ranks 3". The root has no flags of its own but
// --help and --version, so a flag never stops at the root where a command
// after it would not see it: "ddpbench --ranks 3 collective" becomes run's
// command line, which refuses the stray command naming the flag
// (flagBeforeCommand).
func withCommand(args []string) []string {
	if len(args) < 2 {
		return append(slices.Clip(args), "run")
	}
	first := args[1]
	if !strings.HasPrefix(first, "-") {
		return args
	}
	name, _, _ := strings.Cut(strings.TrimLeft(first, "-"), "=")
	for _, f := range []cli.Flag{cli.HelpFlag, cli.VersionFlag} {
		if slices.Contains(f.Names(), name) {
			return args
		}
	}
	return slices.Concat(args[:1], []string{"run"}, args[1:])
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:      "ddpbench",
		Usage:     "benchmark ddpgo's data-parallel reducer and collectives",
		UsageText: "ddpbench [run flags]\nddpbench command [flags]",
		Description: "Without a command, ddpbench runs `run` (ResNet-50 gradients, 2 in-process ranks,\n" +
			"20 ms of simulated backward per step); flags go after their command.\n" +
			"Every flag is also read from DDPBENCH_<FLAG> (upper case, dashes as underscores).\n\n" + exitRule,
		Version:        version(),
		Writer:         stdout,
		ErrWriter:      stderr,
		Action:         unknownCommand,
		OnUsageError:   onUsageError,
		ExitErrHandler: func(*cli.Context, error) {}, // runMain reports and exits
		Commands: []*cli.Command{
			runCommand(),
			sweepCommand(),
			collectiveCommand(),
			infoCommand(),
		},
	}
	for _, c := range app.Commands {
		c.OnUsageError = onUsageError
	}
	return app
}

// unknownCommand is the root's action, which withCommand leaves only a
// first argument that names no command.
func unknownCommand(c *cli.Context) error {
	return usagef("unknown command %q (commands: %s; ddpbench --help)", c.Args().First(), commandNames(c.App))
}

// commandNames lists app's commands, help aside.
func commandNames(app *cli.App) string {
	var names []string
	for _, c := range app.VisibleCommands() {
		if c.Name != "help" {
			names = append(names, c.Name)
		}
	}
	return strings.Join(names, ", ")
}

// flagBeforeCommand is the error for a command written after flags that
// withCommand gave to run ("ddpbench --backend mpi collective"): it names
// those flags, which would otherwise have been ignored, and the command
// line that gives them to the command. Nil when arg is not a command or no
// flag came before it.
func flagBeforeCommand(c *cli.Context, arg string) error {
	raw := rawArgs(c)
	cmd := c.App.Command(arg)
	at := slices.Index(raw, arg)
	if cmd == nil || at < 2 || !strings.HasPrefix(raw[1], "-") {
		return nil
	}
	var flags []string
	for _, a := range raw[1:at] {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && hasFlag(c.Command.Flags, name) {
			flags = append(flags, dashes(name))
		}
	}
	if len(flags) == 0 {
		return nil
	}
	line := []string{"ddpbench", cmd.Name}
	for _, a := range slices.Concat(raw[1:at], raw[at+1:]) {
		line = append(line, shellWord(a))
	}
	return usagef("%s before the command %s: a command's flags go after it (%s)",
		strings.Join(flags, ", "), cmd.Name, strings.Join(line, " "))
}

// hasFlag reports whether one of flags is called name.
func hasFlag(flags []cli.Flag, name string) bool {
	for _, f := range flags {
		if slices.Contains(f.Names(), name) {
			return true
		}
	}
	return false
}

// shellWord quotes a for a shell when it is not a plain word.
func shellWord(a string) string {
	if a == "" || strings.ContainsAny(a, " \t\n'\"\\$`*?[]{}()<>|&;#~") {
		return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return a
}

// version is what --version prints after "ddpbench version": the main
// module's version as the go command recorded it ((devel) when built in
// a working tree, a tag or pseudo-version when installed with go install
// module@version), the VCS revision where recorded, and the Go toolchain.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown (no build information), " + runtime.Version()
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	for _, s := range bi.Settings {
		switch {
		case s.Key == "vcs.revision":
			v += ", revision " + s.Value[:min(12, len(s.Value))]
		case s.Key == "vcs.modified" && s.Value == "true":
			v += " (modified)"
		}
	}
	return fmt.Sprintf("%s, %s %s/%s", v, bi.GoVersion, runtime.GOOS, runtime.GOARCH)
}

// exitRule is the exit status rule, as --help prints it.
const exitRule = `Exit status: 0 the benchmark ran and its results are right; 1 it ran and failed
(wrong results, a timeout, a backend error, an output it could not write); 2 it did not
run because its input is invalid (a flag, a DDPBENCH_ variable, a manifest file, an
output path, more memory than the machine has); 130 interrupted (Ctrl-C), after printing
what was measured so far. In a job of several processes (mpirun), a rank that fails before
the run prints its error first and every rank exits with its status.`

// usageError is invalid input, found before anything ran: exit status 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// interruptedError ends a run cut short by the context after its partial
// results were printed: exit status 130, msg on stderr.
type interruptedError struct {
	msg string
	err error
}

func (e interruptedError) Error() string { return e.msg }
func (e interruptedError) Unwrap() error { return e.err }

// onUsageError rewrites the flag package's messages, which name every
// flag with one dash and never say where the flags are listed.
func onUsageError(c *cli.Context, err error, _ bool) error {
	help := "ddpbench --help"
	if c != nil && c.Command != nil && c.Command.Name != "" && c.App != nil && c.Command.Name != c.App.Name {
		help = "ddpbench " + c.Command.Name + " --help"
	}
	msg := err.Error()
	if m := unknownFlag.FindStringSubmatch(msg); m != nil {
		return usageError{fmt.Errorf("unknown flag %s (%s lists the flags)", dashes(m[1]), help)}
	}
	if m := needsValue.FindStringSubmatch(msg); m != nil {
		return usageError{fmt.Errorf("%s needs a value (%s)", dashes(m[1]), help)}
	}
	if m := badValue.FindStringSubmatch(msg); m != nil {
		return usageError{fmt.Errorf("%s %s: not a valid %svalue (%s)", dashes(m[3]), m[2], m[1], help)}
	}
	return usageError{err}
}

// The flag package's messages that onUsageError rewrites.
var (
	unknownFlag = regexp.MustCompile(`^flag provided but not defined: -+(\S+)$`)
	needsValue  = regexp.MustCompile(`^flag needs an argument: -+(\S+)$`)
	badValue    = regexp.MustCompile(`^invalid (boolean )?value ("[^"]*") for (?:flag )?-+([A-Za-z0-9-]+): .*$`)
)

// dashes spells a flag name as a user types it: -b, --ranks.
func dashes(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// unexpectedArg is the error for a stray argument. The likeliest cause of
// one right after a boolean flag, or of "false" or "true", is a boolean
// flag given its value after a space, which the flag package does not
// accept: say so, naming the flag.
func unexpectedArg(c *cli.Context, arg, where string) error {
	if flag := boolBefore(c, arg); flag != "" {
		return usagef("unexpected argument %q after %s: a boolean flag takes its value after =, as %s=true or %s=false", arg, flag, flag, flag)
	}
	if _, err := strconv.ParseBool(arg); err == nil {
		flag := "--FLAG"
		for _, f := range c.Command.Flags {
			if b, ok := f.(*cli.BoolFlag); ok && c.IsSet(b.Name) {
				flag = "--" + b.Name
				break
			}
		}
		return usagef("unexpected argument %q: a boolean flag takes its value after =, as %s=%s", arg, flag, arg)
	}
	return usagef("unexpected argument %q (%s)", arg, where)
}

// rawArgs returns the command line as runMain got it.
func rawArgs(c *cli.Context) []string {
	args, _ := c.App.Metadata["args"].([]string)
	return args
}

// boolBefore returns the boolean flag (as typed) that arg follows on the
// command line, if it follows one.
func boolBefore(c *cli.Context, arg string) string {
	args := rawArgs(c)
	for i := 1; i < len(args); i++ {
		if args[i] == "--" {
			break
		}
		if args[i] != arg || !strings.HasPrefix(args[i-1], "-") {
			continue
		}
		name := strings.TrimLeft(args[i-1], "-")
		for _, f := range c.Command.Flags {
			if b, ok := f.(*cli.BoolFlag); ok && (b.Name == name || slices.Contains(b.Aliases, name)) {
				return args[i-1]
			}
		}
	}
	return ""
}

// usagef returns a usageError for a flag value that parsed but is invalid.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// oneLine joins a multi-line error into one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}
