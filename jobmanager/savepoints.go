package jobmanager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/weirstream/weir/checkpoint"
	"github.com/weirstream/weir/internal/rpc/weirpb"
	"github.com/weirstream/weir/runtime"
)

// Savepoint statuses, as Flink's asynchronous operations report them.
const (
	SavepointInProgress = "IN_PROGRESS"
	SavepointCompleted  = "COMPLETED"
)

// ErrNoSavepointTarget is returned when a savepoint is asked for without a
// target directory and the job manager has no --savepoint-dir.
var ErrNoSavepointTarget = errors.New("savepoint: no target directory: give one (--target DIR) or start the job manager with --savepoint-dir DIR")

// savepointsKept bounds the savepoint operations a job manager remembers
// per job (for status polls and the dashboard).
const savepointsKept = 20

// SavepointDir is where savepoints go when a trigger names no target
// (Flink's state.savepoints.dir): a directory, which may be on another
// disk than DataDir, or a savepoint URL (s3://bucket/prefix?endpoint=...,
// opened with the CheckpointStorage options, so one set of credentials
// serves both).
func SavepointDir(dir string) Opt { return optFunc(func(c *cfg) { c.savepointDir = dir }) }

// SavepointOp is one savepoint (or stop-with-savepoint) asked of a job:
// Flink's asynchronous operation, polled by its trigger id.
type SavepointOp struct {
	TriggerID string `json:"trigger_id"`
	Job       string `json:"job"`
	// Stop: a stop-with-savepoint (the job ends FINISHED with it).
	Stop bool `json:"stop"`
	// Status is SavepointInProgress or SavepointCompleted (which a failed
	// operation is too, with Failure set, as in Flink).
	Status string `json:"status"`
	// Location is the savepoint's directory (absolute) or URL, once
	// written.
	Location   string        `json:"location,omitempty"`
	Checkpoint checkpoint.ID `json:"checkpoint,omitempty"`
	Failure    string        `json:"failure,omitempty"`
	// TriggeredUnixMs and EndedUnixMs are when it was asked for and ended.
	TriggeredUnixMs int64 `json:"triggered_unix_ms"`
	EndedUnixMs     int64 `json:"ended_unix_ms,omitempty"`
}

// StartSavepoint starts a savepoint of running job id into a new
// location under target (a directory or a savepoint URL such as
// s3://bucket/savepoints, checkpoint.JoinSavepointLocation; "" for the job
// manager's SavepointDir; under SavepointAllowedLocations,
// ErrSavepointLocation otherwise) and
// returns its trigger id at once; SavepointStatus or WaitSavepoint follow
// it. With stop, the job ends FINISHED once the savepoint is written
// (stop-with-savepoint): its sources stop being read, the savepoint is its
// final checkpoint and its transactions commit. With drain (implying
// stop) the sources also stop reading and emit the final watermark before
// the savepoint's barrier, so every event-time window and timer fires into
// it (runtime.MiniCluster.TriggerSavepoint).
func (s *Server) StartSavepoint(ctx context.Context, id, target string, stop, drain bool) (string, error) {
	stop = stop || drain
	target = cmpOr(target, s.cfg.savepointDir)
	if target == "" {
		return "", ErrNoSavepointTarget
	}
	target, confine, err := s.savepointLocation(target)
	if err != nil {
		return "", err
	}
	if _, err := checkpoint.JoinSavepointLocation(target, "x"); err != nil {
		return "", fmt.Errorf("savepoint target: %w", err)
	}
	s.jobs.mu.Lock()
	rj := s.jobs.running[id]
	s.jobs.mu.Unlock()
	if rj == nil {
		if _, err := s.jobs.store.Get(id); err != nil {
			return "", err
		}
		return "", fmt.Errorf("savepoint of job %s: %w", id, ErrJobEnded)
	}
	trigger, err := NewJobID()
	if err != nil {
		return "", err
	}
	op := &SavepointOp{TriggerID: trigger, Job: id, Stop: stop, Status: SavepointInProgress,
		TriggeredUnixMs: time.Now().UnixMilli()}
	s.jobs.mu.Lock()
	ops := append(s.jobs.savepoints[id], op)
	if len(ops) > savepointsKept {
		ops = slices.Delete(ops, 0, len(ops)-savepointsKept)
	}
	s.jobs.savepoints[id] = ops
	s.jobs.wg.Add(1)
	s.jobs.mu.Unlock()
	log := s.cfg.log.With(zap.String("job_id", id), zap.String("trigger_id", trigger), zap.Bool("stop", stop))
	go func() {
		defer s.jobs.wg.Done()
		var location string
		c, err := rj.mc.TriggerSavepoint(s.jobs.ctx, stop, drain, func(c checkpoint.Completed) error {
			dir, err := checkpoint.JoinSavepointLocation(target, "savepoint-"+checkpoint.ShortJobID(id)+"-"+strconv.FormatUint(uint64(c.ID), 10))
			if err != nil {
				return err
			}
			// A savepoint is self-contained: state in checkpoint storage
			// is read into it.
			c, err = s.resolve(s.jobs.ctx, c)
			if err != nil {
				return err
			}
			// The job's type and parameters let state dump decode it.
			if err := checkpoint.WriteSavepoint(s.jobs.ctx, dir, c, time.Now(), s.savepointOpts(append(confine, checkpoint.WithJob(rj.rec.Type, rj.rec.Params))...)...); err != nil {
				return err
			}
			location = dir
			return nil
		})
		s.jobs.mu.Lock()
		op.Status, op.EndedUnixMs = SavepointCompleted, time.Now().UnixMilli()
		if err != nil {
			op.Failure = err.Error()
		} else {
			op.Location, op.Checkpoint = location, c.ID
		}
		s.jobs.mu.Unlock()
		if err != nil {
			log.Warn("savepoint failed", zap.Error(err))
			return
		}
		log.Info("savepoint written", zap.String("location", location), zap.Uint64("checkpoint", uint64(c.ID)))
	}()
	return trigger, nil
}

// retainTimeout bounds writing a cancelled job's retained checkpoint.
const retainTimeout = time.Minute

// retain writes the latest completed checkpoint of cancelled job r out as
// a savepoint if r asked for it (RetainOnCancel) and returns where ("":
// not asked, no checkpoint, or it failed: logged).
func (s *Server) retain(r JobRecord, log *zap.Logger) string {
	if !r.RetainOnCancel {
		return ""
	}
	base := s.cfg.savepointDir
	if base == "" && s.cfg.dir != "" {
		base = filepath.Join(s.cfg.dir, "retained")
	}
	if base == "" {
		log.Error("retain-on-cancel: the job manager has neither --savepoint-dir nor --data-dir; the cancelled job's checkpoint is not retained")
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), retainTimeout)
	defer cancel()
	// The job's type and parameters let state dump decode it.
	dir, c, err := checkpoint.WriteRetained(ctx, checkpoint.Resolving(s.jobs.cps, s.storage, checkpoint.NativeDecoder(runtime.DecodeNativeState)), r.ID, base, time.Now(), s.savepointOpts(checkpoint.WithJob(r.Type, r.Params))...)
	switch {
	case errors.Is(err, checkpoint.ErrNotFound):
		log.Info("retain-on-cancel: the job completed no checkpoint; nothing retained")
		return ""
	case err != nil:
		log.Error("retain-on-cancel: cannot write the cancelled job's latest checkpoint out", zap.Error(err))
		return ""
	}
	log.Info("retained the cancelled job's latest checkpoint as a savepoint", zap.String("location", dir), zap.Uint64("checkpoint", uint64(c.ID)))
	return dir
}

// savepointOpts are opts and the options savepoint URLs are opened with:
// the checkpoint storage's (CheckpointStorage), so that one set of
// credentials serves both.
func (s *Server) savepointOpts(opts ...checkpoint.SavepointOpt) []checkpoint.SavepointOpt {
	return append(opts, checkpoint.StorageOptions(s.cfg.storageOpts...))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// SavepointStatus returns the savepoint operation trigger of job id.
func (s *Server) SavepointStatus(id, trigger string) (SavepointOp, error) {
	s.jobs.mu.Lock()
	defer s.jobs.mu.Unlock()
	for _, op := range s.jobs.savepoints[id] {
		if op.TriggerID == trigger {
			return *op, nil
		}
	}
	return SavepointOp{}, fmt.Errorf("%w: no savepoint operation %s of job %s", errNotFound, trigger, id)
}

// Savepoints returns the savepoint operations of job id this job manager
// ran (its latest savepointsKept), oldest first.
func (s *Server) Savepoints(id string) []SavepointOp {
	s.jobs.mu.Lock()
	defer s.jobs.mu.Unlock()
	ops := make([]SavepointOp, 0, len(s.jobs.savepoints[id]))
	for _, op := range s.jobs.savepoints[id] {
		ops = append(ops, *op)
	}
	return ops
}

// WaitSavepoint waits until savepoint operation trigger of job id ended
// and returns it; a failed one is returned with an error saying why. A
// stop-with-savepoint also waits for the job to end.
func (s *Server) WaitSavepoint(ctx context.Context, id, trigger string) (SavepointOp, error) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		op, err := s.SavepointStatus(id, trigger)
		if err != nil {
			return op, err
		}
		if op.Status == SavepointCompleted {
			if op.Failure != "" {
				return op, fmt.Errorf("savepoint of job %s failed: %s", id, op.Failure)
			}
			if op.Stop {
				s.jobs.mu.Lock()
				rj := s.jobs.running[id]
				s.jobs.mu.Unlock()
				if rj != nil {
					select {
					case <-rj.done:
					case <-ctx.Done():
						return op, ctx.Err()
					}
				}
			}
			return op, nil
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return op, ctx.Err()
		}
	}
}

// savepointWait bounds how long the TriggerSavepoint RPC waits for its
// savepoint (and, for a stop, the job's end).
const savepointWait = 10 * time.Minute

// TriggerSavepoint is the RPC of StartSavepoint followed by WaitSavepoint.
func (s *Server) TriggerSavepoint(ctx context.Context, req *weirpb.TriggerSavepointRequest) (*weirpb.SavepointResult, error) {
	trigger, err := s.StartSavepoint(ctx, req.JobId, req.TargetDirectory, req.Stop, req.Drain)
	if err != nil {
		return nil, rpcError(err)
	}
	ctx, cancel := context.WithTimeout(ctx, savepointWait)
	defer cancel()
	op, err := s.WaitSavepoint(ctx, req.JobId, trigger)
	if err != nil {
		return nil, rpcError(err)
	}
	return &weirpb.SavepointResult{TriggerId: trigger, Location: op.Location, CheckpointId: uint64(op.Checkpoint)}, nil
}

// Flink's savepoint REST shapes (SavepointTriggerRequestBody,
// StopWithSavepointRequestBody, TriggerResponse, AsynchronousOperationResult).
type (
	savepointTriggerBody struct {
		TargetDirectory string `json:"target-directory"`
		CancelJob       bool   `json:"cancel-job"`
	}
	stopBody struct {
		TargetDirectory string `json:"targetDirectory"`
		Drain           bool   `json:"drain"`
	}
	triggerResponse struct {
		RequestID string `json:"request-id"`
	}
	operationStatus struct {
		ID string `json:"id"`
	}
	savepointOperation struct {
		Location     *string `json:"location,omitempty"`
		FailureCause *string `json:"failure-cause,omitempty"`
	}
	savepointResult struct {
		Status    operationStatus     `json:"status"`
		Operation *savepointOperation `json:"operation,omitempty"`
	}
	// savepointList is Weir's GET /jobs/{id}/savepoints (the dashboard's
	// table).
	savepointList struct {
		Savepoints []SavepointOp `json:"savepoints"`
	}
)

// readBody decodes an optional JSON request body into v.
func readBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<16))
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: request body: %w", errBadRequest, err)
	}
	return nil
}

// restTriggerSavepoint is Flink's POST /jobs/{id}/savepoints.
func (s *Server) restTriggerSavepoint(w http.ResponseWriter, r *http.Request) {
	var b savepointTriggerBody
	if err := readBody(r, &b); err != nil {
		restError(w, err)
		return
	}
	if b.CancelJob {
		restError(w, fmt.Errorf("%w: cancel-job is not supported: stop the job with a savepoint (POST /jobs/{id}/stop)", errBadRequest))
		return
	}
	s.restStartSavepoint(w, r, b.TargetDirectory, false, false)
}

// restStop is Flink's POST /jobs/{id}/stop (stop-with-savepoint).
func (s *Server) restStop(w http.ResponseWriter, r *http.Request) {
	var b stopBody
	if err := readBody(r, &b); err != nil {
		restError(w, err)
		return
	}
	s.restStartSavepoint(w, r, b.TargetDirectory, true, b.Drain)
}

func (s *Server) restStartSavepoint(w http.ResponseWriter, r *http.Request, target string, stop, drain bool) {
	trigger, err := s.StartSavepoint(r.Context(), r.PathValue("id"), target, stop, drain)
	if err != nil {
		restError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, triggerResponse{RequestID: trigger})
}

// restSavepointStatus is Flink's GET /jobs/{id}/savepoints/{triggerid}.
func (s *Server) restSavepointStatus(w http.ResponseWriter, r *http.Request) {
	op, err := s.SavepointStatus(r.PathValue("id"), r.PathValue("triggerid"))
	if err != nil {
		restError(w, err)
		return
	}
	res := savepointResult{Status: operationStatus{ID: op.Status}}
	switch {
	case op.Status != SavepointCompleted:
	case op.Failure != "":
		res.Operation = &savepointOperation{FailureCause: &op.Failure}
	default:
		res.Operation = &savepointOperation{Location: &op.Location}
	}
	writeJSON(w, http.StatusOK, res)
}

// restSavepoints is Weir's GET /jobs/{id}/savepoints: the savepoint
// operations this job manager ran for the job, oldest first.
func (s *Server) restSavepoints(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, _, err := s.Job(r.Context(), id); err != nil {
		restError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, savepointList{Savepoints: s.Savepoints(id)})
}

// resolve reads the state c references in checkpoint storage into c, for a
// savepoint, which must be self-contained.
func (s *Server) resolve(ctx context.Context, c checkpoint.Completed) (checkpoint.Completed, error) {
	return checkpoint.Resolve(ctx, s.storage, c, checkpoint.NativeDecoder(runtime.DecodeNativeState))
}
