#include "meta.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "adasum.h"
#include "reduce.h"

namespace mlsl {
namespace {

bool FirstDimFree(OpType op) { return op == OpType::kAllgather || op == OpType::kAlltoall; }

class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}
  template <typename T> void Put(T v) { out_->append(reinterpret_cast<const char*>(&v), sizeof(T)); }
  void Str(const std::string& s) { Put<uint32_t>(uint32_t(s.size())); out_->append(s); }

 private:
  std::string* out_;
};

class Reader {
 public:
  Reader(const char* d, size_t n) : d_(d), n_(n) {}
  template <typename T> bool Get(T* v) {
    if (pos_ + sizeof(T) > n_) return false;
    std::memcpy(v, d_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Str(std::string* s) {
    uint32_t len;
    if (!Get(&len) || pos_ + len > n_) return false;
    s->assign(d_ + pos_, len);
    pos_ += len;
    return true;
  }
  bool AtEnd() const { return pos_ == n_; }

 private:
  const char* d_;
  size_t n_, pos_ = 0;
};

std::string Fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

RequestMeta RequestMeta::From(const Request& r) {
  RequestMeta m;
  m.name = r.name;
  m.op = r.op;
  m.dtype = r.dtype;
  m.reduce_op = r.reduce_op;
  m.prescale = r.prescale;
  m.postscale = r.postscale;
  m.root = r.root;
  m.priority = r.priority;
  m.group = r.group;
  m.wire = r.wire >= 0 && ValidDataType(r.wire) ? DataType(r.wire) : r.dtype;
  m.error_feedback = r.error_feedback;
  m.ranks.assign(r.ranks.begin(), r.ranks.end());
  std::sort(m.ranks.begin(), m.ranks.end());
  for (const TensorInput& t : r.inputs) {
    Shape s = t.shape;
    if (FirstDimFree(r.op) && !s.empty()) s[0] = -1;
    m.shapes.push_back(s);
  }
  return m;
}

bool RequestMeta::operator==(const RequestMeta& o) const { return Difference(o).empty(); }

std::string RequestMeta::Difference(const RequestMeta& o) const {
  if (op != o.op) return std::string("operation ") + OpTypeName(op) + " vs " + OpTypeName(o.op);
  if (dtype != o.dtype) return std::string("dtype ") + DataTypeName(dtype) + " vs " + DataTypeName(o.dtype);
  if (shapes.size() != o.shapes.size()) {
    return "number of tensors " + std::to_string(shapes.size()) + " vs " + std::to_string(o.shapes.size());
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (shapes[i] != o.shapes[i]) {
      std::string which = shapes.size() > 1 ? " of tensor " + std::to_string(i) : "";
      if (FirstDimFree(op) && shapes[i].size() == o.shapes[i].size()) {
        Shape a(shapes[i].begin() + 1, shapes[i].end()), b(o.shapes[i].begin() + 1, o.shapes[i].end());
        return "shape after the first dimension" + which + " " + ShapeString(a) + " vs " + ShapeString(b);
      }
      return "shape" + which + " " + ShapeString(shapes[i]) + " vs " + ShapeString(o.shapes[i]);
    }
  }
  bool reduces = op == OpType::kAllreduce || op == OpType::kReducescatter;
  if (reduces && reduce_op != o.reduce_op) {
    return std::string("reduction ") + ReduceOpName(reduce_op) + " vs " + ReduceOpName(o.reduce_op);
  }
  if (reduces && prescale != o.prescale) return "prescale_factor " + Fmt(prescale) + " vs " + Fmt(o.prescale);
  if (reduces && postscale != o.postscale) return "postscale_factor " + Fmt(postscale) + " vs " + Fmt(o.postscale);
  if (op == OpType::kBroadcast && root != o.root) {
    return "root_rank " + std::to_string(root) + " vs " + std::to_string(o.root);
  }
  if (op == OpType::kRemoveGroup && root != o.root) {  // root holds the group's id
    return "group id " + std::to_string(root) + " vs " + std::to_string(o.root);
  }
  if (priority != o.priority) return "priority " + std::to_string(priority) + " vs " + std::to_string(o.priority);
  if (group != o.group) return "group " + std::to_string(group) + " vs " + std::to_string(o.group);
  if (wire != o.wire) return std::string("wire dtype ") + DataTypeName(wire) + " vs " + DataTypeName(o.wire);
  if (error_feedback != o.error_feedback) {
    return std::string("error feedback ") + (error_feedback ? "on" : "off") + " vs " + (o.error_feedback ? "on" : "off");
  }
  if (ranks != o.ranks) return "group ranks " + ShapeString(Shape(ranks.begin(), ranks.end())) + " vs " +
                               ShapeString(Shape(o.ranks.begin(), o.ranks.end()));
  if (local_error != o.local_error) return "input validity";
  return "";
}

int64_t RequestMeta::RowElements(size_t i) const {
  int64_t n = 1;
  for (size_t d = 1; d < shapes[i].size(); ++d) n *= shapes[i][d];
  return n;
}

void SerializeMetas(const std::vector<RequestMeta>& metas, std::string* out) {
  Writer w(out);
  w.Put<uint32_t>(uint32_t(metas.size()));
  for (const RequestMeta& m : metas) {
    w.Str(m.name);
    w.Put<int32_t>(int32_t(m.op));
    w.Put<int32_t>(int32_t(m.dtype));
    w.Put<int32_t>(int32_t(m.reduce_op));
    w.Put<double>(m.prescale);
    w.Put<double>(m.postscale);
    w.Put<int32_t>(m.root);
    w.Put<int32_t>(m.priority);
    w.Put<int32_t>(m.group);
    w.Put<int32_t>(int32_t(m.wire));
    w.Put<int32_t>(m.error_feedback ? 1 : 0);
    w.Put<uint32_t>(uint32_t(m.ranks.size()));
    for (int32_t v : m.ranks) w.Put<int32_t>(v);
    w.Put<uint32_t>(uint32_t(m.shapes.size()));
    for (const Shape& s : m.shapes) {
      w.Put<uint32_t>(uint32_t(s.size()));
      for (int64_t d : s) w.Put<int64_t>(d);
    }
    w.Str(m.local_error);
  }
}

bool ParseMetas(const char* data, size_t size, std::vector<RequestMeta>* out) {
  Reader r(data, size);
  uint32_t n;
  if (!r.Get(&n)) return false;
  for (uint32_t i = 0; i < n; ++i) {
    RequestMeta m;
    int32_t op, dtype, reduce, wire, feedback;
    uint32_t nshapes, nranks;
    if (!r.Str(&m.name) || !r.Get(&op) || !r.Get(&dtype) || !r.Get(&reduce) || !r.Get(&m.prescale) ||
        !r.Get(&m.postscale) || !r.Get(&m.root) || !r.Get(&m.priority) || !r.Get(&m.group) || !r.Get(&wire) || !r.Get(&feedback) ||
        !r.Get(&nranks)) {
      return false;
    }
    m.ranks.resize(nranks);
    for (auto& v : m.ranks) if (!r.Get(&v)) return false;
    if (!r.Get(&nshapes)) return false;
    m.wire = DataType(wire);
    m.error_feedback = feedback != 0;
    m.op = OpType(op);
    m.dtype = DataType(dtype);
    m.reduce_op = ReduceOp(reduce);
    for (uint32_t j = 0; j < nshapes; ++j) {
      uint32_t rank;
      if (!r.Get(&rank)) return false;
      Shape s(rank);
      for (auto& d : s) if (!r.Get(&d)) return false;
      m.shapes.push_back(std::move(s));
    }
    if (!r.Str(&m.local_error)) return false;
    out->push_back(std::move(m));
  }
  return r.AtEnd();
}

namespace {

// Why an add_group's ranks are not a set of ranks of the job ("" when they are).
std::string GroupRanksError(const std::vector<int>& ranks, int size) {
  if (ranks.empty()) return "a group needs at least one rank";
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= size) {
      return "group rank " + std::to_string(sorted[i]) + " is out of range for " + std::to_string(size) + " ranks";
    }
    if (i && sorted[i] == sorted[i - 1]) return "group rank " + std::to_string(sorted[i]) + " is listed twice";
  }
  return "";
}

// Why an alltoall's splits (or, without them, its first dimension) do not fit `size` ranks.
std::string SplitsError(const Request& r, int size) {
  int64_t rows = r.inputs[0].shape[0];
  if (r.splits.empty()) {
    if (rows % size != 0) {
      return "alltoall without splits needs the first dimension (" + std::to_string(rows) +
             ") to be divisible by the number of ranks (" + std::to_string(size) + ")";
    }
  } else {
    if (int(r.splits.size()) != size) {
      return "alltoall splits has " + std::to_string(r.splits.size()) + " entries but there are " +
             std::to_string(size) + " ranks";
    }
    int64_t sum = 0;
    for (int64_t v : r.splits) {
      if (v < 0) return "alltoall splits contains a negative value (" + std::to_string(v) + ")";
      sum += v;
    }
    if (sum != rows) {
      return "alltoall splits sum to " + std::to_string(sum) + " but the first dimension is " + std::to_string(rows);
    }
  }
  return "";
}

}  // namespace

std::string ValidateLocally(const Request& r, int size) {
  if (r.name.empty()) return "the collective has an empty name";
  if (r.wire >= 0) {
    DataType w = ValidDataType(r.wire) ? DataType(r.wire) : DataType::kUint8;
    if (w != DataType::kFloat32 && w != DataType::kBfloat16 && w != DataType::kFloat16) {
      return "wire dtype " + std::to_string(r.wire) + " is not supported (use float32, bfloat16 or float16)";
    }
  }
  if (r.op == OpType::kAddGroup) {
    std::string why = GroupRanksError(r.ranks, size);
    if (!why.empty()) return why;
  }
  if (r.op == OpType::kAllreduce || r.op == OpType::kReducescatter) {
    Status s = CheckReducible(r.dtype, r.reduce_op);
    if (!s.ok()) return s.message();
    if (r.op == OpType::kReducescatter && r.reduce_op != ReduceOp::kSum && r.reduce_op != ReduceOp::kAverage) {
      return std::string("reducescatter supports Sum and Average, not ") + ReduceOpName(r.reduce_op);
    }
  }
  if (r.op == OpType::kAllreduce && r.reduce_op == ReduceOp::kAdasum) {
    Status s = CheckAdasumSize(size, "'" + ShownName(r.name) + "'");
    if (!s.ok()) return s.message();
    if (r.wire >= 0 && r.wire != int(r.dtype)) {
      return "the Adasum reduction cannot travel compressed (bf16 wire compression, Compression.bf16 / bf16_ef): "
             "its dot products need the tensor's own values; use Compression.none or Compression.fp16";
    }
  }
  bool needs_dim = r.op == OpType::kAllgather || r.op == OpType::kAlltoall || r.op == OpType::kReducescatter;
  for (const TensorInput& t : r.inputs) {
    if (needs_dim && t.shape.empty()) {
      return std::string(OpTypeName(r.op)) + " needs a tensor of rank >= 1, got a scalar";
    }
  }
  if (r.op == OpType::kBroadcast && (r.root < 0 || r.root >= size)) {
    return "root_rank " + std::to_string(r.root) + " is out of range for " + std::to_string(size) + " ranks";
  }
  if (r.op == OpType::kAlltoall && !r.inputs.empty()) return SplitsError(r, size);
  return "";
}

int64_t Elements(const RequestMeta& m) {
  int64_t n = 0;
  for (const Shape& s : m.shapes) n += NumElements(s);
  return n;
}

}  // namespace mlsl
