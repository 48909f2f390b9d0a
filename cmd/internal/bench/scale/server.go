package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// server is a PostgreSQL cluster of the benchmark's own: initdb into a
// temporary directory, pg_ctl on a free loopback port, removed by stop. It
// runs as the postgres user when the benchmark runs as root (initdb refuses
// root).
type server struct {
	bin, dir, port string
	runAs          string // user name, or "" for the current user
	wal            string // the wal_level it runs with
	settings       []string
}

// startServer creates and starts the cluster with settings (postgresql.conf
// lines) and wal_level wal.
func startServer(ctx context.Context, settings []string, wal string) (*server, error) {
	bin, err := pgBin()
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "idemq-bench-scale-")
	if err != nil {
		return nil, err
	}
	s := &server{bin: bin, dir: dir, port: strconv.Itoa(port), settings: settings}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root, initdb needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		s.runAs = "postgres"
	}
	data := filepath.Join(dir, "data")
	if err := s.cmd(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8"); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	conf := append([]string{"listen_addresses = '127.0.0.1'", "port = " + s.port, "unix_socket_directories = '" + dir + "'"}, settings...)
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString("\n" + strings.Join(conf, "\n") + "\n")
		err = errors.Join(err, f.Close())
	}
	if err == nil {
		err = s.start(ctx, wal)
	}
	if err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// dsn is the URL of the cluster's postgres database.
func (s *server) dsn() string {
	return "postgres://postgres@127.0.0.1:" + s.port + "/postgres?sslmode=disable"
}

func (s *server) start(ctx context.Context, wal string) error {
	opts := "-c wal_level=" + wal
	if wal == "minimal" {
		opts += " -c max_wal_senders=0"
	}
	if err := s.cmd(ctx, "pg_ctl", "-D", filepath.Join(s.dir, "data"), "-l", filepath.Join(s.dir, "log"), "-o", opts, "-w", "-t", "300", "start"); err != nil {
		return err
	}
	s.wal = wal
	return nil
}

// setWAL restarts the cluster with wal_level wal unless it runs with it.
func (s *server) setWAL(ctx context.Context, wal string) error {
	if s.wal == wal {
		return nil
	}
	if err := s.cmd(ctx, "pg_ctl", "-D", filepath.Join(s.dir, "data"), "-m", "fast", "-w", "-t", "600", "stop"); err != nil {
		return err
	}
	return s.start(ctx, wal)
}

// stop stops the cluster (fast shutdown, then immediate) and removes its
// directory.
func (s *server) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	data := filepath.Join(s.dir, "data")
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
		if err := s.cmd(ctx, "pg_ctl", "-D", data, "-m", "fast", "-w", "-t", "120", "stop"); err != nil {
			_ = s.cmd(ctx, "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
		}
	}
	if err := os.RemoveAll(s.dir); err != nil {
		fmt.Fprintln(os.Stderr, "bench: remove", s.dir+":", err)
	}
}

// cmd runs one of the server's programs, as s.runAs when set.
func (s *server) cmd(ctx context.Context, name string, args ...string) error {
	path := filepath.Join(s.bin, name)
	var c *exec.Cmd
	if s.runAs != "" {
		c = exec.CommandContext(ctx, "runuser", append([]string{"-u", s.runAs, "--", path}, args...)...)
	} else {
		c = exec.CommandContext(ctx, path, args...)
	}
	c.Dir = s.dir
	out, err := c.CombinedOutput()
	if err != nil {
		log := ""
		if b, rerr := os.ReadFile(filepath.Join(s.dir, "log")); rerr == nil {
			log = "\n" + tail(string(b), 2000)
		}
		return fmt.Errorf("%s %s: %w\n%s%s", name, strings.Join(args, " "), err, tail(string(out), 2000), log)
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// pgBin returns the directory of the newest installed PostgreSQL's
// programs (Debian's layout, then pg_config's).
func pgBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		d := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server programs (initdb) found: install PostgreSQL (make services does) or set IDEMQ_BENCH_PG_DSN")
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
