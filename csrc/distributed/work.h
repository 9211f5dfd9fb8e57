// The Work objects of tpu_dist and the threads that complete them.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

namespace torch_tpu::dist {

// A Work completed by a tpu_dist thread.
class TpuWork : public c10d::Work {
 public:
  TpuWork(int rank, c10d::OpType type, const char* profiling_title, std::vector<at::Tensor> outputs);
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  uint64_t getSequencenumber() const override { return seq_; }
  void set_sequence_number(uint64_t seq) { seq_ = seq; }
  void complete(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  uint64_t seq_ = 0;
};

// One worker thread running tasks in order.
class Executor {
 public:
  explicit Executor(std::string name);
  ~Executor();  // runs what is queued, then joins
  void submit(std::function<void()> task);

 private:
  void run();
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace torch_tpu::dist
