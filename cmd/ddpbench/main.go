// Command ddpbench benchmarks ddpgo: data-parallel training steps over a
// model manifest (run, sweep), nccl-tests style collective sweeps
// (collective) and the environment (info). With no arguments it runs
// `ddpbench run` with defaults that finish in a few seconds.
//
// Every flag can also be set through an environment variable named
// DDPBENCH_ followed by the flag's name in upper case with dashes as
// underscores (--bucket-cap-mb: DDPBENCH_BUCKET_CAP_MB). A flag given on
// the command line wins over the variable.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"
)

func main() {
	// The first interrupt cancels the run, which then stops its ranks,
	// erases the progress bar and exits; a second one kills at once.
	ctx, cancel := context.WithCancel(context.Background())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		signal.Stop(sig)
		cancel()
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
	if err := newApp(stdout, stderr).RunContext(ctx, args); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "ddpbench: interrupted\n")
			return 130
		}
		msg := oneLine(err)
		var u usageError
		if errors.As(err, &u) {
			fmt.Fprintf(stderr, "ddpbench: %s%s\n", msg, fromEnv(msg, args))
			return 2
		}
		fmt.Fprintf(stderr, "ddpbench: %s\n", msg)
		return 1
	}
	return 0
}

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

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:      "ddpbench",
		Usage:     "benchmark ddpgo's data-parallel reducer and collectives",
		UsageText: "ddpbench [run flags]\nddpbench command [flags]",
		Description: "Without a command, ddpbench runs `run` (ResNet-50 gradients, 2 in-process ranks).\n" +
			"Every flag is also read from DDPBENCH_<FLAG> (upper case, dashes as underscores).",
		Writer:         stdout,
		ErrWriter:      stderr,
		Flags:          runFlags(),
		Action:         runAction,
		OnUsageError:   onUsageError,
		ExitErrHandler: func(*cli.Context, error) {}, // runMain reports and exits
		Commands: []*cli.Command{
			runCommand(),
			sweepCommand(),
			collectiveCommand(),
			infoCommand(),
		},
		HideVersion: true,
	}
	for _, c := range app.Commands {
		c.OnUsageError = onUsageError
	}
	return app
}

// usageError is a bad command line: exit status 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func onUsageError(_ *cli.Context, err error, _ bool) error { return usageError{err} }

// usagef returns a usageError for a flag value that parsed but is invalid.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// oneLine joins a multi-line error into one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}
