package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// flags is a subcommand's flag set whose every flag can also be given as an
// environment variable FANOUT_<NAME> (upper case, dashes as underscores).
// A flag on the command line wins over the environment.
type flags struct {
	*flag.FlagSet
	extraEnv map[string][]string // flag name -> further variables, e.g. DATABASE_URL
	secrets  []fileSecret        // the flags that may also be read from a file (secretVar)
}

// fileSecret is a flag whose value may instead be read from a file named by
// the flag NAME-file (a mounted Kubernetes Secret, say), so that the secret
// is in neither the command line nor the environment.
type fileSecret struct {
	name  string
	value *string
	file  *string
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

// secretVar defines the string flag name, which holds a secret (a database
// URL with its password), and name-file, a file to read it from instead:
// one trailing newline is dropped, as a mounted Secret often has one.
// Giving both, or a file that is empty or cannot be read, is an error that
// names the flags and the file, never what it holds.
func (f *flags) secretVar(p *string, name, usage string) {
	f.StringVar(p, name, "", usage)
	file := new(string)
	f.StringVar(file, name+"-file", "", "file holding --"+name+" (a mounted Secret; one trailing newline is dropped)")
	f.secrets = append(f.secrets, fileSecret{name: name, value: p, file: file})
}

// readSecretFiles sets every secret flag whose NAME-file is given from that file.
func (f *flags) readSecretFiles() error {
	for _, s := range f.secrets {
		if *s.file == "" {
			continue
		}
		if *s.value != "" {
			return fmt.Errorf("--%s and --%s-file are both set (on the command line or as %s and %s): give one",
				s.name, s.name, strings.Join(f.envNames(s.name), ", "), strings.Join(f.envNames(s.name+"-file"), ", "))
		}
		v, err := readSecretFile(*s.file)
		if err != nil {
			return fmt.Errorf("--%s-file: %w", s.name, err)
		}
		*s.value = v
	}
	return nil
}

// readSecretFile reads a secret from path: its content less one trailing
// newline, which must not be empty. Its errors name the file only.
func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = fmt.Errorf("read %s: %w", path, pe.Err) // the path, not the content
		}
		return "", err
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if strings.TrimSpace(v) == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return v, nil
}

// parse parses args, then fills every flag not given on the command line
// from the environment, then reads the secret flags given as files.
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
	if err != nil {
		return err
	}
	return f.readSecretFiles()
}
