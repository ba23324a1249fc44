// Package subagent runs one LLM subagent per task on a worker: the agent
// Loop (reserve, call the model, settle, run tools), the tool registry, the
// compression of a task's work into a Summary, and the worker's gRPC server.
package subagent
