#include "distributed/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace torch_tpu::dist {
namespace {

constexpr const char* kPrefix = "tpudist_p";

[[noreturn]] void fail(const std::string& what, const std::string& name) {
  throw std::runtime_error("tpu_dist: " + what + " shared-memory segment '" + name +
                           "' failed: " + std::strerror(errno));
}

// State letter and start time of a process from /proc/<pid>/stat, or false.
bool read_stat(int64_t pid, char* state, uint64_t* start_time) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return false;
  std::string line;
  std::getline(in, line);
  // The command name is in parentheses and may contain spaces: parse after the last ')'.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  rest >> field;  // field 3: state
  if (field.empty()) return false;
  *state = field[0];
  for (int i = 4; i <= 22; ++i) {
    if (!(rest >> field)) return false;
  }
  *start_time = std::strtoull(field.c_str(), nullptr, 10);  // field 22: starttime
  return true;
}

}  // namespace

ShmSegment::~ShmSegment() { reset(); }

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    reset();
    name_ = std::move(other.name_);
    data_ = other.data_;
    size_ = other.size_;
    linked_ = other.linked_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.linked_ = false;
  }
  return *this;
}

void ShmSegment::reset() {
  unlink();
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) fail("creating", name);
  ShmSegment seg;
  seg.name_ = name;
  seg.linked_ = true;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int saved = errno;
    close(fd);
    shm_unlink(name.c_str());
    errno = saved;
    fail("sizing (" + std::to_string(bytes) + " bytes)", name);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int saved = errno;
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    errno = saved;
    fail("mapping", name);
  }
  seg.data_ = p;
  seg.size_ = bytes;
  return seg;
}

ShmSegment ShmSegment::open(const std::string& name, size_t min_bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) fail("opening", name);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    close(fd);
    fail("inspecting", name);
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < min_bytes) {
    close(fd);
    throw std::runtime_error("tpu_dist: shared-memory segment '" + name + "' has " + std::to_string(bytes) +
                             " bytes, expected at least " + std::to_string(min_bytes) +
                             " (ranks configured with different TORCH_TPU_DIST_* sizes?)");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) fail("mapping", name);
  ShmSegment seg;
  seg.name_ = name;
  seg.data_ = p;
  seg.size_ = bytes;
  return seg;
}

void ShmSegment::unlink() {
  if (linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

std::string segment_name(pid_t pid, const std::string& token, int rank) {
  return "/" + std::string(kPrefix) + std::to_string(pid) + "_" + token + "_r" + std::to_string(rank);
}

namespace {
std::vector<std::string> our_segments() {
  std::vector<std::string> names;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return names;
  while (dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, kPrefix, std::strlen(kPrefix)) == 0) names.emplace_back(e->d_name);
  }
  closedir(dir);
  return names;
}
}  // namespace

int remove_stale_segments() {
  int removed = 0;
  for (const auto& name : our_segments()) {
    const int64_t pid = std::strtoll(name.c_str() + std::strlen(kPrefix), nullptr, 10);
    if (pid <= 0) continue;
    char state = 0;
    uint64_t start = 0;
    const bool gone = (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ||
                      (read_stat(pid, &state, &start) && (state == 'Z' || state == 'X'));
    if (gone && shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

std::string list_segments() {
  std::string out;
  for (const auto& name : our_segments()) out += (out.empty() ? "" : ",") + name;
  return out;
}

ProcessId ProcessId::self() {
  ProcessId id;
  id.pid = getpid();
  char state = 0;
  read_stat(id.pid, &state, &id.start_time);
  return id;
}

bool process_alive(const ProcessId& id) {
  if (id.pid <= 0) return false;
  if (kill(static_cast<pid_t>(id.pid), 0) != 0 && errno == ESRCH) return false;
  char state = 0;
  uint64_t start = 0;
  if (!read_stat(id.pid, &state, &start)) {
    // /proc unreadable (another pid namespace): trust kill().
    return kill(static_cast<pid_t>(id.pid), 0) == 0 || errno == EPERM;
  }
  if (state == 'Z' || state == 'X') return false;
  return id.start_time == 0 || start == id.start_time;
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000);
  ts.tv_nsec = static_cast<long>((timeout.count() % 1000000) * 1000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace torch_tpu::dist
