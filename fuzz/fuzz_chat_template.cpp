// libFuzzer target: chat_template.json text (ChatTemplate::from_json), then render of a few
// messages whose roles and contents come from the same input.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/serve/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto t = kiln::ChatTemplate::from_json(text);
  if (!t.ok()) return 0;
  std::vector<kiln::ChatMessage> msgs = {{"system", text.substr(0, 64)}, {"user", text}, {"assistant", "ok"}};
  if (size > 0) msgs.push_back({std::string(1, static_cast<char>(data[0])), "x"});  // an unknown role too
  (void)t->render(msgs);
  (void)t->to_json();
  return 0;
}
