package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// flags is a subcommand's flag set whose every flag can also be given as an
// environment variable FANOUT_<NAME> (upper case, dashes as underscores).
// A flag on the command line wins over the environment.
type flags struct {
	*flag.FlagSet
	extraEnv map[string][]string // flag name -> further variables, e.g. DATABASE_URL
}

func newFlags(name, usage string, stderr io.Writer) *flags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &flags{FlagSet: fs, extraEnv: map[string][]string{}}
	fs.Usage = func() {
		fmt.Fprint(stderr, strings.TrimLeft(usage, "\n"))
		fmt.Fprintln(stderr, "\nFlags (each also read from the environment variable shown):")
		fs.VisitAll(func(fl *flag.Flag) {
			def := ""
			if fl.DefValue != "" {
				def = fmt.Sprintf(" (default %q)", fl.DefValue)
			}
			fmt.Fprintf(stderr, "  --%s  [%s]%s\n      %s\n", fl.Name, strings.Join(f.envNames(fl.Name), ", "), def, fl.Usage)
		})
	}
	return f
}

// envNames lists the variables that can set flag name, in order of precedence.
func (f *flags) envNames(name string) []string {
	return append([]string{"FANOUT_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))}, f.extraEnv[name]...)
}

// alsoEnv lets variable set flag name when FANOUT_<NAME> is unset.
func (f *flags) alsoEnv(name, variable string) {
	f.extraEnv[name] = append(f.extraEnv[name], variable)
}

// parse parses args, then fills every flag not given on the command line
// from the environment.
func (f *flags) parse(args []string, getenv func(string) string) error {
	if err := f.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	var err error
	f.VisitAll(func(fl *flag.Flag) {
		if set[fl.Name] || err != nil {
			return
		}
		for _, env := range f.envNames(fl.Name) {
			if v := getenv(env); v != "" {
				if e := fl.Value.Set(v); e != nil {
					err = fmt.Errorf("%s=%q: %w", env, v, e)
				}
				return
			}
		}
	})
	return err
}
