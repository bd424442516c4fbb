%%% @doc What a client may see of a failure's detail: text, depth-limited,
%%% with node paths replaced by `<path>'. The port's details name kernel
%%% directories, cache files and the checkout; a remote caller of the
%%% device has no business knowing the node's filesystem.
-module(kem_redact).
-export([text/1]).

%% An absolute path: a `/' that starts a word (not the `//' of a URL, which
%% follows a `:') and runs to the next space, quote or bracket.
-define(PATH, "(^|[\\s'\"(\\[=,])/[^\\s'\")\\],]+").

%% @doc Detail as valid UTF-8 text (a JSON encoder and `re' refuse
%% anything else), node paths masked.
-spec text(term()) -> binary().
text(Detail) ->
    re:replace(utf8(to_text(Detail)), ?PATH, "\\1<path>", [global, {return, binary}, unicode]).

%% Each byte that is not part of valid UTF-8 becomes U+FFFD: a detail may
%% quote a kernel's or a gateway's bytes.
utf8(Bin) ->
    case unicode:characters_to_binary(Bin, utf8, utf8) of
        Good when is_binary(Good) -> Good;
        {_, Good, <<_, Rest/binary>>} -> <<Good/binary, 16#EF, 16#BF, 16#BD, (utf8(Rest))/binary>>
    end.

to_text(Bin) when is_binary(Bin) -> Bin;
%% Depth-limited: a reason may carry a caller's whole input binary.
to_text(Term) -> iolist_to_binary(io_lib:format("~0P", [Term, 12])).

%%% Tests

-ifdef(TEST).
-include_lib("eunit/include/eunit.hrl").

redact_test() ->
    ?assertEqual(<<"no kernel 'x' in <path>">>, text(<<"no kernel 'x' in /srv/node/kernels">>)),
    ?assertEqual(<<"dirs: <path>, <path>">>, text(<<"dirs: /a/b, /c">>)),
    ?assertEqual(<<"'<path>' missing">>, text(<<"'/home/op/.cache/kem/x.wgsl' missing">>)),
    %% URLs and ids stay.
    ?assertEqual(<<"GET https://arweave.net/abc failed">>, text(<<"GET https://arweave.net/abc failed">>)),
    ?assertEqual(<<"{kernel_not_found,<<\"<path>\">>}">>, text({kernel_not_found, <<"/x/y">>})),
    %% Bytes that are not UTF-8 (a cut sequence, a lone 0xFF) never reach
    %% re or a JSON encoder.
    ?assertEqual(<<"a", 16#EF, 16#BF, 16#BD, "b", 16#EF, 16#BF, 16#BD, 16#EF, 16#BF, 16#BD, 16#C3, 16#A9>>,
                 text(<<"a", 16#FF, "b", 16#E2, 16#80, 16#C3, 16#A9>>)).
-endif.
