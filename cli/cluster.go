package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/weirstream/weir/jobmanager"
	"github.com/weirstream/weir/taskmanager"
)

// envJobManager names the environment variable with the job manager's
// address, the default of --jobmanager.
const envJobManager = "WEIR_JOBMANAGER"

func defaultJobManager() string {
	if v := os.Getenv(envJobManager); v != "" {
		return v
	}
	return "127.0.0.1:6123"
}

func newJobManagerCmd(a *app) *cobra.Command {
	var listen, httpAddr, dataDir string
	cmd := &cobra.Command{
		Use:   "jobmanager [--listen 127.0.0.1:6123] [--http 127.0.0.1:8081] [--data-dir DIR]",
		Short: "Run a job manager (task-manager sessions only so far)",
		Long: `jobmanager serves the control plane (gRPC) on --listen: task managers register,
offer slots and heartbeat both ways; a task manager silent for 3s is dropped.
--http serves GET /taskmanagers (JSON). Job submission, scheduling and
checkpoint coordination across processes are not built yet (issue 12).

It prints "jobmanager listening on HOST:PORT" and "jobmanager http on
HOST:PORT" on stdout once it accepts connections, and stops cleanly on
SIGINT/SIGTERM.`,
		Args: cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			if dataDir != "" {
				if err := os.MkdirAll(dataDir, 0o755); err != nil {
					return fmt.Errorf("jobmanager: --data-dir: %w", err)
				}
			}
			lis, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("jobmanager: --listen: %w", err)
			}
			hl, err := net.Listen("tcp", httpAddr)
			if err != nil {
				lis.Close()
				return fmt.Errorf("jobmanager: --http: %w", err)
			}
			ctx := cmd.Context()
			srv := jobmanager.New(jobmanager.Logger(log))
			mux := http.NewServeMux()
			mux.HandleFunc("GET /taskmanagers", func(w http.ResponseWriter, _ *http.Request) {
				type tm struct {
					ID          string `json:"id"`
					Slots       int    `json:"slots"`
					DataAddress string `json:"data_address"`
					Session     uint64 `json:"session"`
				}
				out := []tm{}
				for _, t := range srv.TaskManagers() {
					out = append(out, tm{t.ID, t.Slots, t.DataAddress, t.Session})
				}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(out)
			})
			hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
			go func() { _ = hs.Serve(hl) }()
			defer func() {
				sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				_ = hs.Shutdown(sctx)
			}()
			fmt.Fprintf(a.stdout, "jobmanager listening on %s\n", lis.Addr())
			fmt.Fprintf(a.stdout, "jobmanager http on %s\n", hl.Addr())
			log.Info("job manager started", zap.String("listen", lis.Addr().String()), zap.String("http", hl.Addr().String()))
			return srv.Serve(ctx, lis)
		}),
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:6123", "control-plane (gRPC) address")
	cmd.Flags().StringVar(&httpAddr, "http", "127.0.0.1:8081", "HTTP address (GET /taskmanagers)")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory for the job manager's state (created; nothing is stored in it yet)")
	return cmd
}

func newTaskManagerCmd(a *app) *cobra.Command {
	var jm, dataDir, id string
	var slots int
	cmd := &cobra.Command{
		Use:   "taskmanager [--jobmanager 127.0.0.1:6123] [--slots 2] [--data-dir DIR]",
		Short: "Run a task manager (registers and heartbeats; runs no tasks yet)",
		Long: `taskmanager registers with the job manager (--jobmanager, default $WEIR_JOBMANAGER
or 127.0.0.1:6123) offering --slots slots, heartbeats both ways, and reconnects by
itself when the session is lost (a job manager restarted, or silent for the
timeout it announced). It does not run tasks yet (issue 12). Stops cleanly on
SIGINT/SIGTERM.`,
		Args: cobra.NoArgs,
		RunE: a.withLogger(func(cmd *cobra.Command, log *zap.Logger) error {
			if slots < 1 {
				return flagError(cmd, fmt.Errorf("--slots %d must be at least 1", slots))
			}
			if dataDir != "" {
				if err := os.MkdirAll(dataDir, 0o755); err != nil {
					return fmt.Errorf("taskmanager: --data-dir: %w", err)
				}
			}
			if id == "" {
				host, _ := os.Hostname()
				id = fmt.Sprintf("%s-%d", host, os.Getpid())
			}
			err := taskmanager.Run(cmd.Context(), jm, taskmanager.ID(id), taskmanager.Slots(slots), taskmanager.Logger(log))
			if errors.Is(err, context.Canceled) && cmd.Context().Err() != nil {
				return nil
			}
			return err
		}),
	}
	cmd.Flags().StringVar(&jm, "jobmanager", defaultJobManager(), "job manager address (default $"+envJobManager+" or 127.0.0.1:6123)")
	cmd.Flags().IntVar(&slots, "slots", 2, "slots offered to the job manager")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory for the task manager's state (created; nothing is stored in it yet)")
	cmd.Flags().StringVar(&id, "id", "", "task manager id (default HOST-PID)")
	return cmd
}
