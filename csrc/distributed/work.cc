#include "distributed/work.h"

#include <pthread.h>

namespace torch_tpu::dist {

using c10d::OpType;

// ---------------------------------------------------------------- TpuWork

TpuWork::TpuWork(int rank, OpType type, const char* profiling_title, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type, profiling_title),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

void TpuWork::complete(std::exception_ptr error) {
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

// ---------------------------------------------------------------- Executor

Executor::Executor(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] { run(); });
}

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Executor::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void Executor::run() {
  pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace torch_tpu::dist
