// Chat template: rendering, JSON form, and the file stored beside the model.
#include "kiln/serve/chat_template.h"
#include "kiln/core/json.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "kiln/core/file_io.h"

namespace kiln {

namespace {
std::string fill(const std::string& format, const std::string& content) {
  std::string out;
  size_t i = 0;
  for (size_t at; (at = format.find("{content}", i)) != std::string::npos; i = at + 9) out += format.substr(i, at - i) + content;
  return out + format.substr(i);
}
}  // namespace

Expected<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages) const {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system" || m.role == "developer") {
      out += fill(system, m.content);
    } else if (m.role == "user") {
      out += fill(user, m.content);
    } else if (m.role == "assistant") {
      out += fill(assistant, m.content);
    } else {
      return invalid_argument("messages[{}].role '{}' is not one of system, user, assistant", i, m.role);
    }
  }
  return out + generation_prompt;
}

std::string ChatTemplate::to_json() const {
  nlohmann::json j;
  j["format"] = "kiln-chat-v1";
  j["system"] = system;
  j["user"] = user;
  j["assistant"] = assistant;
  j["generation_prompt"] = generation_prompt;
  j["stop"] = stop;
  return j.dump(2) + "\n";
}

Expected<ChatTemplate> ChatTemplate::from_json(const std::string& text) {
  KILN_ASSIGN_OR_RETURN(const nlohmann::json j, parse_json(text, "[chat template]"));
  if (!j.is_object()) return invalid_argument("[chat template] not a JSON object");
  ChatTemplate t;
  for (auto [key, field] : {std::pair{"system", &t.system}, std::pair{"user", &t.user},
                            std::pair{"assistant", &t.assistant}, std::pair{"generation_prompt", &t.generation_prompt}}) {
    if (!j.contains(key)) continue;
    if (!j[key].is_string()) return invalid_argument("[chat template] '{}' must be a string", key);
    *field = j[key].get<std::string>();
  }
  if (j.contains("stop")) {
    if (!j["stop"].is_array()) return invalid_argument("[chat template] 'stop' must be an array of strings");
    t.stop.clear();
    for (const auto& s : j["stop"]) {
      if (!s.is_string() || s.get<std::string>().empty())
        return invalid_argument("[chat template] 'stop' must hold non-empty strings");
      t.stop.push_back(s.get<std::string>());
    }
  }
  return t;
}

Expected<ChatTemplate> load_chat_template(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kChatTemplateFile).string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return ChatTemplate{};
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(path, int64_t{1} << 20));
  auto t = ChatTemplate::from_json(text);
  if (!t.ok()) return invalid_argument("{}: {}", path, t.status().message());
  return t;
}

Status save_chat_template(const std::string& dir, const ChatTemplate& t) {
  const std::string text = t.to_json();
  return write_file_atomic((std::filesystem::path(dir) / kChatTemplateFile).string(), {text});
}

}  // namespace kiln
