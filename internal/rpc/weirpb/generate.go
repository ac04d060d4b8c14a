// Package weirpb is the generated code of Weir's control-plane protocol
// (control.proto): messages and the JobManager gRPC service. Do not edit the
// *.pb.go files; change control.proto and regenerate (go generate).
package weirpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative control.proto
